"""Read the records of an offline wandb run file (`run-<id>.wandb`).

The file is wandb's 7-byte header followed by LevelDB's log format: 32 KiB blocks of chunks, each
`crc32 (4) | length (2, little-endian) | type (1: full, 2: first, 3: middle, 4: last) | data`; each
complete record is a serialized `wandb_internal_pb2.Record`.
"""

from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
CHUNK_HEADER = 7


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a wandb run file"
    out, pending, pos = [], b"", HEADER
    while pos + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < CHUNK_HEADER:  # block trailer padding
            pos += left_in_block
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out
