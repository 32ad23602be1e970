"""flowerdigits: a Flower / PyTorch app on scikit-learn's handwritten digits."""
