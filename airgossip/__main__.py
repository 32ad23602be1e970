from airgossip.cli import app

app(prog_name="airgossip")
