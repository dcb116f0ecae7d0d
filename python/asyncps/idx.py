"""Reading IDX files (the MNIST / Fashion-MNIST format), gzipped or not.

An IDX file is a big-endian header -- two zero bytes, a type code, the
number of dimensions, then one uint32 per dimension -- followed by the
row-major values. Debian's ``dataset-fashion-mnist`` installs the four
Fashion-MNIST files in ``/usr/share/datasets/fashion-mnist``.
"""

import gzip
import os
import struct

import numpy as np

DEFAULT_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

# IDX type code -> numpy dtype (big-endian where it matters).
_TYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path):
    """Returns the array stored in the IDX file `path` (``.gz`` is unzipped).

    Raises ValueError naming the file when the header is malformed or the
    data is shorter or longer than the header says.
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: not an IDX file (bad magic)")
    type_code, ndim = data[2], data[3]
    if type_code not in _TYPES:
        raise ValueError(f"{path}: unknown IDX type code 0x{type_code:02x}")
    if ndim == 0 or len(data) < 4 + 4 * ndim:
        raise ValueError(f"{path}: truncated IDX header ({ndim} dimensions)")
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    dtype = _TYPES[type_code]
    count = int(np.prod(shape, dtype=np.int64))
    offset = 4 + 4 * ndim
    if len(data) - offset != count * dtype.itemsize:
        raise ValueError(
            f"{path}: header says {shape} ({count * dtype.itemsize} bytes of "
            f"data) but the file holds {len(data) - offset}")
    values = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return values.reshape(shape).astype(dtype.newbyteorder("="))


def load_fashion_mnist(data_dir=DEFAULT_FASHION_MNIST_DIR):
    """Returns ((train_images, train_labels), (test_images, test_labels)).

    Images are uint8 of shape (N, 28, 28) (divide by 255 for [0, 1]);
    labels are int64.
    """

    def split(prefix):
        images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(
                f"{data_dir}: {prefix} images {images.shape} and labels "
                f"{labels.shape} do not match")
        return images.astype(np.uint8), labels.astype(np.int64)

    return split("train"), split("t10k")
