"""Prepare MNIST in a shared folder the way a sweep's jobs do, with a slow stand-in for the download.

`python slow_download.py DATA_DIR SOURCE_DIR COUNT_FILE`: torchvision's download is replaced by a copy
from SOURCE_DIR that writes each file in small pieces with pauses, so concurrent jobs would see
half-written files if the data module did not serialize them. Each real "download" appends a line to
COUNT_FILE. Prints the number of training labels it then loaded.
"""

import sys
import time
from pathlib import Path

from torchvision.datasets import MNIST

from hydralight.data import MNISTDataModule

data_dir, source, count_file = map(Path, sys.argv[1:4])


def slow_copy(self) -> None:
    if self._check_exists():
        return
    with count_file.open("a") as f:
        f.write("download\n")
    raw = Path(self.raw_folder)
    raw.mkdir(parents=True, exist_ok=True)
    for src in sorted((source / "MNIST" / "raw").iterdir()):
        data = src.read_bytes()
        with (raw / src.name).open("wb") as out:
            for i in range(0, len(data), 4096):
                out.write(data[i : i + 4096])
                out.flush()
                time.sleep(0.002)


MNIST.download = slow_copy
dm = MNISTDataModule(str(data_dir), val_size=100)
dm.prepare_data()
dm.setup("fit")
print(len(dm.splits["train"]))
