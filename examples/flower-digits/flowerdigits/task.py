"""flowerdigits: a Flower / PyTorch app on scikit-learn's handwritten digits."""

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    """A small MLP for 8x8 digit images."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """This partition's train and test loaders: an IID share of the 1,797 digits, split
    80/20 (the data ships inside scikit-learn: nothing is downloaded)."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(42).permutation(len(y))
    part = np.array_split(order, num_partitions)[partition_id]
    cut = int(0.8 * len(part))
    train, test = part[:cut], part[cut:]

    def loader(idx: np.ndarray, shuffle: bool) -> DataLoader:
        data = TensorDataset(torch.tensor(x[idx] / 16.0, dtype=torch.float32), torch.tensor(y[idx]))
        return DataLoader(data, batch_size=batch_size, shuffle=shuffle)

    return loader(train, True), loader(test, False)


def train(net: nn.Module, trainloader: DataLoader, epochs: int, lr: float, device) -> float:
    """Train the model on the training set; return the mean training loss."""
    net.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net: nn.Module, testloader: DataLoader, device) -> tuple[float, float]:
    """Validate the model on the test set; return (loss, accuracy)."""
    net.to(device)
    criterion = nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    net.eval()
    with torch.no_grad():
        for images, labels in testloader:
            outputs = net(images.to(device))
            labels = labels.to(device)
            loss += criterion(outputs, labels).item()
            correct += (outputs.argmax(1) == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
