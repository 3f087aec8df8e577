"""`mode=predict`: a checkpoint's predictions on the data module's predict data (the test split unless
`predict.source` names other files), written into the run dir.

Lightning runs the module's own `predict_step` over `predict_dataloader` (`trainer.predict`); the writer, a
`BasePredictionWriter`, keeps each rank's outputs on the CPU with their sample ids. At the end every rank saves
its share (`predictions.rank<N>.pt`) and rank 0 merges the shares in sample order into one file:

- `predictions.csv` when `predict_step` returns class probabilities, `{"probabilities": (B, C)}` with `labels`
  (-1: none) and `ids` when it has them, as the built-in modules do: one row per sample (its id or file,
  the true label when known, the predicted class and its probability);
- `predictions.pt` for any other output (a tensor, or a dict of tensors, batch first): `{"sample": ids, ...}`
  with each output's rows in the same order.
"""

from __future__ import annotations

import csv
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BasePredictionWriter
from pytorch_lightning.utilities.model_helpers import is_overridden

from hydralight.errors import UserError

CSV_FILE = "predictions.csv"
TENSOR_FILE = "predictions.pt"
UNLABELLED = -1


def prepare_prediction(module: pl.LightningModule, data: Any, source: str | None) -> None:
    """Before anything is written: the module must have a `predict_step` of its own, and the data module must
    read `predict.source` when one is given (its `predict_from`); a data module without predict data predicts
    on its test data."""
    if not is_overridden("predict_step", module):
        # Lightning's default calls forward on the whole batch (labels and ids too), which most modules' forward
        # cannot take: it would fail inside the module, after the run dir is written.
        raise UserError(
            f"mode=predict runs the module's predict_step, and {type(module).__name__} has none; give it "
            "`def predict_step(self, batch, batch_idx)` returning {'probabilities': ...} (a predictions.csv) or "
            "any tensors, batch first (a predictions.pt)"
        )
    if source is not None:
        if not callable(reader := getattr(data, "predict_from", None)):
            raise UserError(
                f"predict.source={source}: the data module {type(data).__name__} reads no other source (it has no "
                "predict_from(source) method); leave predict.source out to predict on its own data"
            )
        reader(source)
    if isinstance(data, pl.LightningDataModule) and not is_overridden("predict_dataloader", data):
        if not is_overridden("test_dataloader", data):
            raise UserError(
                f"the data module {type(data).__name__} has neither predict_dataloader nor test_dataloader: "
                "mode=predict has nothing to predict on; give it a predict_dataloader"
            )
        data.predict_dataloader = data.test_dataloader  # type: ignore[method-assign]  # the test split, hooks and all
    if isinstance(data, pl.LightningDataModule):
        data.predict_dataloader = _OneLoader(data.predict_dataloader, type(data).__name__)  # type: ignore[method-assign]


class _OneLoader:
    """The data module's predict loaders, refused in one line when there are several: one file of rows by sample id
    would mix the loaders' ids (Lightning's own check, of `predict_step`'s arguments, comes first and is no
    user's line). A class, not a closure: a `ddp_spawn` run pickles the data module."""

    def __init__(self, make: Callable[[], Any], data: str) -> None:
        self.__wrapped__, self.data = make, data  # __wrapped__: what Lightning's is_overridden looks through

    def __call__(self) -> Any:
        made = self.__wrapped__()
        if isinstance(made, list | tuple | dict) and len(made) > 1:
            raise UserError(
                f"mode=predict writes the predictions of one loader, and {self.data}.predict_dataloader returns "
                f"{len(made)}; return one (a data argument can choose which), and predict each in a run of its own"
            )
        return made


def _as_outputs(prediction: Any, module: str) -> dict[str, torch.Tensor]:
    """A `predict_step`'s return value as named tensors of one batch; one line for anything else."""
    outputs = {"predictions": prediction} if torch.is_tensor(prediction) else prediction
    if isinstance(outputs, dict) and outputs and all(torch.is_tensor(v) and v.dim() >= 1 for v in outputs.values()):
        rows = {len(v) for v in outputs.values()}
        if len(rows) == 1:
            return {str(k): v for k, v in outputs.items()}
    raise UserError(
        f"{module}.predict_step returned {_describe(prediction)}; return a tensor, or a dict of tensors with the "
        "batch first (one row per sample)"
    )


def _describe(value: Any) -> str:
    if torch.is_tensor(value):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, dict):
        shapes = ", ".join(
            f"{k}: {list(v.shape) if torch.is_tensor(v) else type(v).__name__}" for k, v in value.items()
        )
        return f"a dict ({shapes})"
    return f"a {type(value).__name__}"


class PredictionWriter(BasePredictionWriter):
    """Keeps this rank's predictions with their sample ids (a batch's own `ids`, else the indices Lightning's
    predict loop tracks); at the end rank 0 writes all ranks' in sample order (`written` says what and where)."""

    def __init__(self, run_dir: str | Path) -> None:
        super().__init__(write_interval="batch")
        self.run_dir = Path(run_dir)
        self.parts: list[dict[str, torch.Tensor]] = []
        self.seen = 0
        self.written: dict[str, Any] | None = None

    def write_on_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        outputs = _as_outputs(prediction, type(pl_module).__name__)
        rows = len(next(iter(outputs.values())))
        if "ids" not in outputs:
            if batch_indices is None and trainer.world_size > 1:
                raise UserError(
                    f"{type(pl_module).__name__}.predict_step returns no sample ids and its loader's order cannot be "
                    "tracked (an iterable dataset): return {'ids': ...} with the predictions, or predict on 1 process"
                )
            ids = batch_indices if batch_indices is not None else range(self.seen, self.seen + rows)
            outputs["ids"] = torch.as_tensor(list(ids), dtype=torch.int64)
        self.seen += rows
        self.parts.append({k: v.detach().cpu() for k, v in outputs.items()})

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        keys = {tuple(sorted(part)) for part in self.parts}
        if len(keys) > 1:
            raise UserError(
                f"{type(pl_module).__name__}.predict_step returned other keys for other batches "
                f"({' / '.join(', '.join(k) for k in sorted(keys))}); return the same ones for every batch"
            )
        share = {k: torch.cat([part[k] for part in self.parts]) for k in self.parts[0]} if self.parts else {}
        torch.save(share, self.run_dir / f"predictions.rank{trainer.global_rank}.pt")
        trainer.strategy.barrier("predictions")  # every share is on disk before rank 0 reads them
        if trainer.is_global_zero:
            self.written = self._merge(trainer)

    def _merge(self, trainer: pl.Trainer) -> dict[str, Any]:
        files = [self.run_dir / f"predictions.rank{rank}.pt" for rank in range(trainer.world_size)]
        shares = [share for share in (torch.load(f, weights_only=True) for f in files) if share]
        merged = {k: torch.cat([share[k] for share in shares]) for k in shares[0]} if shares else {}
        for f in files:
            f.unlink()
        if not merged:
            raise UserError("there was nothing to predict on: the predict data is empty")
        order = torch.argsort(merged["ids"], stable=True)
        merged = {k: v[order] for k, v in merged.items()}
        ids = merged.pop("ids")
        if len(ids.unique()) != len(ids):
            raise UserError(
                "some samples were predicted more than once (the processes' shares overlap): a data module that "
                "shards its loaders itself (shards_by_rank = True) must give each sample to one rank only"
            )
        datamodule = getattr(trainer, "datamodule", None)  # not declared on the Trainer type
        if "probabilities" in merged:
            named = getattr(datamodule, "predict_names", None)
            names = named() if callable(named) else None
            return self._write_csv(ids, merged, names, getattr(datamodule, "classes", None))
        path = self.run_dir / TENSOR_FILE
        _replace(path, lambda tmp: torch.save({"sample": ids, **merged}, tmp))
        return {"predictions": str(path), "rows": len(ids), "metrics": {}}

    def _write_csv(
        self, ids: torch.Tensor, out: dict[str, torch.Tensor], names: list[str] | None, classes: list[str] | None
    ) -> dict[str, Any]:
        probability, predicted = out["probabilities"].max(-1)
        labels = out.get("labels")
        labelled = labels is not None and bool((labels != UNLABELLED).any())
        names = names if names is not None and len(ids) and int(ids.max()) < len(names) else None
        shown = (lambda i: classes[i]) if classes else str
        header = ["sample", *(["file"] if names else []), *(["label"] if labelled else []), "predicted", "probability"]
        rows = []
        for n, sample in enumerate(ids.tolist()):
            row = [sample, *([names[sample]] if names else [])]
            if labelled:
                label = int(labels[n])  # type: ignore[index]
                row.append(shown(label) if label != UNLABELLED else "")
            row += [shown(int(predicted[n])), f"{float(probability[n]):.6f}"]
            rows.append(row)
        path = self.run_dir / CSV_FILE

        def write(tmp: Path) -> None:
            with tmp.open("w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(header)
                writer.writerows(rows)

        _replace(path, write)
        metrics = {}
        if labelled:
            known = labels != UNLABELLED
            metrics["predict/acc"] = float((predicted[known] == labels[known]).double().mean())  # type: ignore[index]
        return {"predictions": str(path), "rows": len(rows), "metrics": metrics}


def _replace(path: Path, write: Any) -> None:
    """Write `path` whole or not at all: to a temporary file, then renamed."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def predict(trainer: pl.Trainer, module: pl.LightningModule, data: Any, writer: PredictionWriter) -> None:
    """Every rank predicts its share; the writer merges them (rank 0)."""
    with warnings.catch_warnings():
        # The project's samplers give every sample once, unpadded; Lightning cannot know that of a custom sampler.
        warnings.filterwarnings("ignore", message="You are using a custom batch sampler")
        trainer.predict(module, datamodule=data, return_predictions=False)


def prediction_results(written: dict[str, Any] | None, checkpoint: str | None) -> dict[str, Any]:
    """results.json of a predict run: the file, its rows, the checkpoint, the accuracy where labels are known."""
    written = written or {"predictions": None, "rows": None, "metrics": {}}
    return {"mode": "predict", "best_checkpoint": checkpoint, **written}


def prediction_line(results: dict[str, Any]) -> str:
    """The last line of a predict run: the file and how many rows it has."""
    acc = results["metrics"].get("predict/acc")
    labelled = f"accuracy {acc:.4f} where labelled; " if acc is not None else ""
    return (
        f"predictions: {results['rows']} rows in {results['predictions']} "
        f"({labelled}checkpoint: {results['best_checkpoint']})"
    )
