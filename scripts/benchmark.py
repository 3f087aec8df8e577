"""Benchmarks, each a ratio measured side by side in one run: `python scripts/benchmark.py [--smoke]`.

1. framework overhead: the project's Lightning loop vs a plain PyTorch loop (same model, batches, optimizer)
2. data path: the tensor loader vs torchvision MNIST + ToTensor/Normalize through a DataLoader
3. time to 99%: `python train.py experiment=fast` vs the fastest plain PyTorch script found for the same bar
   (scripts/plain_floor.py) on seeds 0-9 with 1 and 2 threads; process start to `test/acc`
4. classic: the classic recipe (model=cnn, torchvision loader, 3 epochs) once, against experiment=fast
5. start-up: `python train.py --cfg job`, and process start to the first training step
6. scaling: 1 vs 2 DDP processes on CPU, same global batch and steps; and `experiment=fast` on 2 DDP processes
   vs plain torch DDP of the same recipe (scripts/plain_ddp.py), process start to `test/acc`
7. keyed dropout: a training step of the default network with per-sample keyed dropout vs torch's dropout
8. cheap step: ms per optimizer step of a cheap step: plain loop, bare Lightning, the project's `train.py`
9. sweeps: process start to the first job of a 10,000-job grid vs a 4-job grid; the report over 1,000 job dirs
10. install: the same runs in an environment of the project alone (`--core-python`, `pip install hydralight`)
   and in this one (the extras too): `import pytorch_lightning`, experiment=fast against the plain floor, the
   first step beyond torch's import. Measured only when --core-python is given.

Every figure is the median of --repeats runs with min and max. Results go to benchmarks/RESULTS.md
and benchmarks/results.png (or --out). Needs the real MNIST in DATA_DIR, except with --smoke, which
runs everything tiny on generated data to prove the suite works.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, str(ROOT / "train.py")]


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def timed(fn, repeats: int) -> dict[str, float]:
    return summary([fn() for _ in range(repeats)])


def with_scripts() -> str:
    """PYTHONPATH for a run that loads the benchmark's callbacks (scripts/), keeping the caller's own."""
    return os.pathsep.join(p for p in (str(ROOT / "scripts"), os.environ.get("PYTHONPATH", "")) if p)


def run(command: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-12000:]}")
    return seconds, result.stdout + result.stderr


# 1. Framework overhead ------------------------------------------------------------------------------
def bare_lightning_seconds(
    net_cfg: dict, datamodule, steps: int, accelerator: str = "cpu", callbacks: tuple = ()
) -> float:
    """Seconds of `fit` for `steps` steps of the project's module in a Trainer without logger, checkpoints,
    progress bar or validation (and with `callbacks`, e.g. a clock)."""
    import pytorch_lightning as pl

    from hydralight.tasks.classifier import Classifier
    from hydralight.training.console import quiet_framework

    quiet_framework()
    pl.seed_everything(0, verbose=False)
    model = Classifier(net=net_cfg, optimizer={"_target_": "torch.optim.Adam", "_partial_": True}, lr=1e-3)
    trainer = pl.Trainer(accelerator=accelerator, devices=1, max_steps=steps, limit_val_batches=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         use_distributed_sampler=False, num_sanity_val_steps=0, callbacks=list(callbacks))  # fmt: skip
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    if accelerator == "gpu":
        import torch

        torch.cuda.synchronize()
    return time.perf_counter() - start


def framework_overhead(data_dir: str, steps: int, repeats: int) -> dict:
    """Seconds for `steps` optimizer steps: Lightning (project loop, logging on) vs plain PyTorch."""
    import torch
    import torch.nn.functional as F

    from hydralight.data import MEAN, STD, MNISTDataModule
    from hydralight.tasks.classifier import Classifier

    torch.set_num_threads(os.cpu_count() or 1)
    net_cfg = {"_target_": "hydralight.tasks.nets.FastCNN", "channels": [24, 48], "hidden": 128}
    opt_cfg = {"_target_": "torch.optim.Adam", "_partial_": True}
    dm = MNISTDataModule(data_dir, global_size=64, val_size=5000 if "smoke" not in data_dir else 100, download=False)
    dm.setup("fit")

    def lightning() -> float:
        return bare_lightning_seconds(net_cfg, dm, steps)

    def plain() -> float:
        torch.manual_seed(0)
        model = Classifier(net=net_cfg, optimizer=opt_cfg, lr=1e-3).net
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        start = time.perf_counter()
        done = 0
        while done < steps:
            for x, y, _ in dm.train_dataloader():
                x = x.float().div_(255.0).sub_(MEAN).div_(STD)
                loss = F.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                done += 1
                if done == steps:
                    break
        return time.perf_counter() - start

    lightning()  # warm-up: first-call costs are not the loop's
    # Interleaved, so that drift in the machine's speed hits both sides alike.
    pairs = [(lightning(), plain()) for _ in range(repeats)]
    results = {"lightning_s": summary([a for a, _ in pairs]), "plain_s": summary([b for _, b in pairs])}
    # The median of each pair's ratio: the machine's drift between pairs cancels in each.
    results["ratio"] = statistics.median(a / b for a, b in pairs)
    results["steps"] = steps
    return results


# 2. Data path --------------------------------------------------------------------------------------
def data_path(data_dir: str, batches: int, repeats: int) -> dict:
    import torch
    from torch.utils.data import DataLoader
    from torchvision import transforms
    from torchvision.datasets import MNIST

    from hydralight.data import MEAN, STD, MNISTDataModule

    dm = MNISTDataModule(data_dir, global_size=128, val_size=5000 if "smoke" not in data_dir else 100, download=False)
    dm.setup("fit")

    def fast() -> float:
        start, n = time.perf_counter(), 0
        for i, batch in enumerate(dm.train_dataloader()):
            x, y, _ = dm.on_after_batch_transfer(batch, 0)
            n += len(y)
            if i + 1 == batches:
                break
        return n / (time.perf_counter() - start)

    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MEAN,), (STD,))])
    dataset = MNIST(data_dir, train=True, download=False, transform=tf)

    def classic() -> float:
        loader = DataLoader(dataset, batch_size=128, shuffle=True, num_workers=1)
        start, n = time.perf_counter(), 0
        for i, (_, y) in enumerate(loader):
            n += len(y)
            if i + 1 == batches:
                break
        return n / (time.perf_counter() - start)

    torch.manual_seed(0)
    results = {"tensor_samples_per_s": timed(fast, repeats), "torchvision_samples_per_s": timed(classic, repeats)}
    results["ratio"] = results["tensor_samples_per_s"]["median"] / results["torchvision_samples_per_s"]["median"]
    return results


# 3. Time to 99% ------------------------------------------------------------------------------------
# The floor: the fastest plain PyTorch script found that holds the same bar (scripts/plain_floor.py; the search
# is in benchmarks/recipe_search.md), not a copy of the project's recipe. Every seed runs with 1 and with 2
# threads: CPU numerics differ with the thread count.
PLAIN_FLOOR = ROOT / "scripts" / "plain_floor.py"
PLAIN_DDP = ROOT / "scripts" / "plain_ddp.py"
SEEDS = tuple(range(10))
THREADS = (1, 2)


def accuracy_of(output: str) -> float:
    return float(re.findall(r"^test/acc=(\d\.\d+)", output, re.M)[-1])


def until_result(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Seconds from process start to its `test/acc=` line (what a user waits for; teardown after it is
    left out), and that accuracy."""
    start = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seconds, lines = None, []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if seconds is None and line.startswith("test/acc="):
            seconds = time.perf_counter() - start
    if process.wait() or seconds is None:
        raise RuntimeError(f"{' '.join(command)} failed:\n{''.join(lines)[-3000:]}")
    return seconds, accuracy_of("".join(lines))


def tiny(smoke: bool) -> list[str]:
    """The overrides that make a run of `train.py` tiny in a smoke run."""
    return ["data.val_size=100", "trainer.limit_train_batches=5", "batch.eval_size=50"] if smoke else []


def fast_command(smoke: bool, python: str = sys.executable) -> list[str]:
    """`train.py experiment=fast` as timed here."""
    return [python, str(ROOT / "train.py"), "experiment=fast", "hardware=cpu", "logger=none", *tiny(smoke)]


def time_to_99(data_dir: str, repeats: int, smoke: bool, out: Path) -> dict:
    """experiment=fast and the plain floor on every seed of SEEDS with each thread count of THREADS,
    interleaved so both see the same machine load."""
    fast = fast_command(smoke)
    seeds, threads = (SEEDS[:1], THREADS[:1]) if smoke else (SEEDS, THREADS)
    runs: dict[str, dict[int, dict[str, list[float]]]] = {"fast": {}, "plain": {}}
    for n in threads:
        env = {"DATA_DIR": data_dir, "OMP_NUM_THREADS": str(n)}
        for seed in seeds:
            commands = {
                "fast": [*fast, f"seed={seed}", f"hydra.run.dir={tempfile.mkdtemp(dir=out)}"],
                "plain": [sys.executable, str(PLAIN_FLOOR), data_dir, str(seed)],
            }
            for name, command in commands.items():
                seconds, acc = until_result(command, env)
                table = runs[name].setdefault(n, {"seconds": [], "test_acc": []})
                table["seconds"].append(seconds)
                table["test_acc"].append(acc)
    results: dict = {"seeds": list(seeds), "threads": list(threads)}
    for name, by_threads in runs.items():
        results[name] = {
            **summary([t for r in by_threads.values() for t in r["seconds"]]),
            "test_acc": [a for r in by_threads.values() for a in r["test_acc"]],
            "by_threads": {str(n): r for n, r in by_threads.items()},
        }
    results["vs_plain"] = {
        str(n): statistics.median(runs["fast"][n]["seconds"]) / statistics.median(runs["plain"][n]["seconds"])
        for n in threads
    }
    return results


def ddp_vs_plain(data_dir: str, repeats: int, smoke: bool, out: Path) -> dict:
    """`experiment=fast` on 2 DDP processes (one thread each) against plain torch DDP of the same recipe
    (scripts/plain_ddp.py), process start to `test/acc`, interleaved over seeds; the median of pair ratios."""
    seeds = SEEDS[:1] if smoke else SEEDS[:repeats]
    project = [*fast_command(smoke), "hardware.devices=2", "strategy=ddp"]
    runs: dict[str, list[float]] = {"project": [], "plain": []}
    accs: dict[str, list[float]] = {"project": [], "plain": []}
    for seed in seeds:
        env = {"DATA_DIR": data_dir, "OMP_NUM_THREADS": "1"}
        commands = {
            "project": [*project, f"seed={seed}", f"hydra.run.dir={tempfile.mkdtemp(dir=out)}"],
            "plain": [sys.executable, str(PLAIN_DDP), data_dir, str(seed)],
        }
        for name, command in commands.items():
            seconds, acc = until_result(command, env)
            runs[name].append(seconds)
            accs[name].append(acc)
    ratios = [a / b for a, b in zip(runs["project"], runs["plain"], strict=True)]
    return {
        "seeds": list(seeds),
        "project_s": summary(runs["project"]),
        "plain_s": summary(runs["plain"]),
        "test_acc": accs,
        "ratio": statistics.median(ratios),
        "ratio_by_seed": summary(ratios),
    }


# 4. Classic recipe ---------------------------------------------------------------------------------
def classic(data_dir: str, smoke: bool, out: Path) -> dict:
    """The classic recipe once (a long run), and experiment=fast once beside it, process start to `test/acc`."""
    env = {"DATA_DIR": data_dir}
    fast = fast_command(smoke)
    old = [*TRAIN, "model=cnn", "data.loader=torchvision", "batch.global_size=128", "trainer.max_epochs=3",
           "hardware=cpu", "logger=none", *tiny(smoke)]  # fmt: skip
    (c, c_acc), (f, f_acc) = (
        until_result([*cmd, f"hydra.run.dir={tempfile.mkdtemp(dir=out)}"], env) for cmd in (old, fast)
    )
    return {"classic_s": c, "classic_acc": c_acc, "fast_s": f, "fast_acc": f_acc, "speedup": c / f}


def recipe_table(t: dict) -> list[str]:
    """Test accuracy per seed and thread count, experiment=fast and the plain floor."""
    names = ["fast", "plain"]
    head = " | ".join(f"{'experiment=fast' if n == 'fast' else 'plain floor'}, {k} thread{'s' * (k > 1)}"
                      for n in names for k in t["threads"])  # fmt: skip
    lines = [f"| seed | {head} |", "|---" * (1 + len(names) * len(t["threads"])) + "|"]
    for i, seed in enumerate(t["seeds"]):
        cells = [f"{t[n]['by_threads'][str(k)]['test_acc'][i]:.4f}" for n in names for k in t["threads"]]
        lines.append(f"| {seed} | {' | '.join(cells)} |")
    mins = [f"**{min(t[n]['by_threads'][str(k)]['test_acc']):.4f}**" for n in names for k in t["threads"]]
    lines.append(f"| min | {' | '.join(mins)} |")
    secs = [fmt(summary(t[n]["by_threads"][str(k)]["seconds"]), 1) for n in names for k in t["threads"]]
    lines.append(f"| seconds, start to `test/acc` | {' | '.join(secs)} |")
    return lines


# 5. Start-up ---------------------------------------------------------------------------------------
def first_step_seconds(data_dir: str, out: Path, python: str = sys.executable) -> float:
    """Process start to the end of experiment=fast's first training step (a clock callback says when)."""
    start = time.time()
    _, output = run(
        [
            python,
            str(ROOT / "train.py"),
            "experiment=fast",
            "hardware=cpu",
            "logger=none",
            "trainer.max_steps=1",
            "+callbacks.clock._target_=bench_clock.FirstStepClock",
            "data.val_size=100",
            f"hydra.run.dir={tempfile.mkdtemp(dir=out)}",
        ],  # fmt: skip
        {"DATA_DIR": data_dir, "PYTHONPATH": with_scripts()},
    )
    return float(re.findall(r"first step done at (\d+\.\d+)", output)[0]) - start


def floor_first_step_seconds(data_dir: str) -> float:
    """Process start to the end of the plain floor's first training step: what torch alone takes to get there
    (its optimizer imports torch._dynamo, as Lightning's import does)."""
    start = time.time()
    _, output = run(
        [sys.executable, str(ROOT / "scripts" / "plain_floor.py"), data_dir, "0"], {"FLOOR_FIRST_STEP": "1"}
    )
    return float(re.findall(r"first step done at (\d+\.\d+)", output)[0]) - start


def bare_lightning_first_step_seconds(data_dir: str) -> float:
    """Process start to the end of the plain floor's first step in a bare Lightning Trainer: what Lightning
    alone takes to get there (scripts/bare_lightning_start.py)."""
    start = time.time()
    _, output = run([sys.executable, str(ROOT / "scripts" / "bare_lightning_start.py"), data_dir, "0"],
                    {"PYTHONPATH": with_scripts()})  # fmt: skip
    return float(re.findall(r"first step done at (\d+\.\d+)", output)[0]) - start


def startup(data_dir: str, repeats: int, out: Path) -> dict:
    cfg_job = timed(lambda: run([*TRAIN, "--cfg", "job"])[0], repeats)
    # torch's own import, the plain floor's and bare Lightning's first steps on the same machine, interleaved
    # with the runs.
    torch_import, first, floor, bare = [], [], [], []
    for _ in range(repeats):
        torch_import.append(run([sys.executable, "-c", "import torch"])[0])
        first.append(first_step_seconds(data_dir, out))
        floor.append(floor_first_step_seconds(data_dir))
        bare.append(bare_lightning_first_step_seconds(data_dir))
    torch_s = statistics.median(torch_import)
    return {"cfg_job_s": cfg_job, "first_step_s": summary(first), "torch_import_s": summary(torch_import),
            "first_step_beyond_torch_s": statistics.median(first) - torch_s,
            "floor_first_step_s": summary(floor), "floor_first_step_beyond_torch_s": statistics.median(floor) - torch_s,
            "bare_first_step_s": summary(bare), "bare_first_step_beyond_torch_s": statistics.median(bare) - torch_s,
            "first_step_beyond_bare_s": statistics.median(first) - statistics.median(bare)}  # fmt: skip


# 10. install: the project alone against the project with its extras -----------------------------------
def install_extras(data_dir: str, repeats: int, out: Path, smoke: bool, core_python: str) -> dict:
    """The same runs side by side in two environments: `core_python`'s holds the project and its dependencies
    only (`pip install hydralight`), this one the extras too (`pip install -e '.[dev]'`: scipy, matplotlib, ...).
    torchmetrics, which Lightning imports at its own import, imports scipy.signal and matplotlib whenever they
    are installed. Per repeat, interleaved: `import torch` and `import pytorch_lightning` in each,
    experiment=fast (2 threads) in each and the plain floor, and the first step of the core install."""
    envs = {"core": core_python, "extras": sys.executable}
    figures: dict[str, list[float]] = {}
    accs: dict[str, list[float]] = {"core": [], "extras": []}

    def add(name: str, value: float) -> None:
        figures.setdefault(name, []).append(value)

    threads = {"DATA_DIR": data_dir, "OMP_NUM_THREADS": "2"}
    for seed in SEEDS[:repeats]:
        for side, python in envs.items():
            add(f"{side}_torch_import_s", run([python, "-c", "import torch"])[0])
            add(f"{side}_lightning_import_s", run([python, "-c", "import pytorch_lightning"])[0])
            command = [*fast_command(smoke, python), f"seed={seed}", f"hydra.run.dir={tempfile.mkdtemp(dir=out)}"]
            seconds, acc = until_result(command, threads)
            add(f"{side}_fast_s", seconds)
            accs[side].append(acc)
        add("plain_s", until_result([core_python, str(PLAIN_FLOOR), data_dir, str(seed)], threads)[0])
        add("core_first_step_s", first_step_seconds(data_dir, out, core_python))
    median = {name: statistics.median(values) for name, values in figures.items()}
    return {
        **{name: summary(values) for name, values in figures.items()},
        "test_acc": accs,
        "lightning_import_ratio": median["core_lightning_import_s"] / median["extras_lightning_import_s"],
        "fast_ratio": median["core_fast_s"] / median["extras_fast_s"],
        "core_vs_plain": median["core_fast_s"] / median["plain_s"],
        "extras_vs_plain": median["extras_fast_s"] / median["plain_s"],
        "core_first_step_beyond_torch_s": median["core_first_step_s"] - median["core_torch_import_s"],
    }


# 9. sweeps: the first job of a large grid, the report of many jobs ----------------------------------
def first_job_seconds(grid: list[str], data_dir: str, out: Path) -> float:
    """Process start to the line Hydra logs as it starts job #0 of `-m GRID` (its config composed); the sweep
    is stopped there."""
    command = [*TRAIN, "-m", *grid, "model=mlp", "hardware=cpu", "trainer.max_steps=1",
               f"hydra.sweep.dir={tempfile.mkdtemp(dir=out)}"]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "DATA_DIR": data_dir}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        for line in proc.stdout or ():
            if re.search(r"\t#0 : ", line):
                return time.perf_counter() - start
        raise RuntimeError(f"{' '.join(command)} started no job")
    finally:
        proc.kill()
        proc.wait()


def many_job_dirs(source: Path, sweep: Path, count: int) -> Path:
    """`count` copies of the job dir `source` in `sweep`, each with its own seed and learning rate."""
    import shutil

    for number in range(count):
        job = sweep / str(number)
        shutil.copytree(source, job, symlinks=True)
        overrides = [f"seed={number % 10}", f"optim.lr={0.001 * (1 + number // 10):g}"]
        (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
        manifest = json.loads((job / "manifest.json").read_text())
        manifest.update(overrides=overrides, run_dir=str(job))
        (job / "manifest.json").write_text(json.dumps(manifest))
    return sweep


def sweeps(data_dir: str, repeats: int, out: Path, smoke: bool) -> dict:
    """The first job of a 10,000-job grid against that of a 4-job grid (same keys), side by side; the
    report over 1,000 job dirs against the report over 10."""
    large, small = ["seed=range(100)", "data.val_size=range(1000,1100)"], ["seed=range(2)", "data.val_size=1000,1001"]
    if smoke:
        large, small = ["seed=range(100)", "data.val_size=range(100,200)"], ["seed=range(2)", "data.val_size=100,101"]
    pairs = [(first_job_seconds(large, data_dir, out), first_job_seconds(small, data_dir, out)) for _ in range(repeats)]
    source = out / "report-source"
    run([*TRAIN, "-m", "seed=1", "model=mlp", "hardware=cpu", "trainer.max_steps=20", "data.val_size=100",
         f"hydra.sweep.dir={source}"], {"DATA_DIR": data_dir})  # fmt: skip
    jobs = 100 if smoke else 1000
    many, few = (
        many_job_dirs(source / "0", out / "report-many", jobs),
        many_job_dirs(source / "0", out / "report-few", 10),
    )
    report = [sys.executable, "-m", "hydralight.report"]
    timings = [(run([*report, str(many)])[0], run([*report, str(few)])[0]) for _ in range(repeats)]
    return {
        "grid_jobs": 10_000,
        "first_job_large_s": summary([a for a, _ in pairs]),
        "first_job_small_s": summary([b for _, b in pairs]),
        "first_job_ratio": statistics.median(a / b for a, b in pairs),
        "report_jobs": jobs,
        "report_many_s": summary([a for a, _ in timings]),
        "report_few_s": summary([b for _, b in timings]),
        "report_ratio": statistics.median(a / b for a, b in timings),
    }


# 6. 1 vs 2 processes ------------------------------------------------------------------------------
def scaling(data_dir: str, steps: int, repeats: int, out: Path) -> dict:
    results = {}
    for devices in (1, 2):

        def once(devices=devices) -> float:
            _, output = run([*TRAIN, "hardware=cpu", f"hardware.devices={devices}", "model=fastcnn",
                             "batch.global_size=128", f"trainer.max_steps={steps}", "trainer.limit_val_batches=0",
                             "trainer.limit_test_batches=1", "logger=none", "data.val_size=100",
                             "+callbacks.clock._target_=bench_clock.StepClock", f"+callbacks.clock.warmup={steps // 5}",
                             f"hydra.run.dir={tempfile.mkdtemp(dir=out)}"],
                            {"DATA_DIR": data_dir, "PYTHONPATH": with_scripts()})  # fmt: skip
            return 128 * float(re.findall(r"steady steps per second (\d+\.\d+)", output)[0])

        results[f"{devices}_process_samples_per_s"] = timed(once, repeats)
    one, two = (results[f"{d}_process_samples_per_s"]["median"] for d in (1, 2))
    results["speedup"] = two / one
    results["efficiency"] = two / one / 2
    results["ddp_overhead_ms_per_step"] = (128 / two - 128 / one / 2) * 1000  # time beyond a perfect split
    results["steps"] = steps
    return results


# 7. Keyed dropout --------------------------------------------------------------------------------
def keyed_dropout(steps: int, repeats: int) -> dict:
    """Milliseconds per training step (forward, backward, Adam) of SeedCNN at batch 128 on this machine's
    CPU: dropout keyed by sample vs torch's dropout, interleaved so both see the same machine state."""
    import torch
    import torch.nn.functional as F

    from hydralight.keyed import keyed, sample_keys, with_sample_dropout
    from hydralight.tasks.nets import SeedCNN

    torch.manual_seed(0)
    nets = {"torch": SeedCNN(), "keyed": with_sample_dropout(SeedCNN())}
    optimizers = {name: torch.optim.Adam(net.parameters(), lr=1e-3) for name, net in nets.items()}
    x, y = torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,))

    def step_ms(name: str) -> float:
        net, optimizer = nets[name].train(), optimizers[name]
        start = time.perf_counter()
        for step in range(steps):
            keys = sample_keys(0, step, torch.randperm(60000)[:128]) if name == "keyed" else None
            with keyed(keys):
                loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return (time.perf_counter() - start) / steps * 1000

    for name in nets:  # warm-up
        step_ms(name)
    times: dict[str, list[float]] = {"torch": [], "keyed": []}
    for _ in range(repeats):
        for name in nets:
            times[name].append(step_ms(name))
    result = {f"{name}_ms_per_step": summary(values) for name, values in times.items()}
    # The median of each repeat's ratio: the machine's drift between repeats cancels in each.
    result["ratio"] = statistics.median(k / t for k, t in zip(times["keyed"], times["torch"], strict=True))
    result["steps"] = steps
    return result


# 8. Cheap step ------------------------------------------------------------------------------------
def cheap_step(
    data_dir: str,
    window: tuple[int, int],
    repeats: int,
    out: Path,
    smoke: bool,
    accelerator: str = "cpu",
    overrides: tuple[str, ...] = (),
) -> dict:
    """Milliseconds per optimizer step when the step itself is cheap (MLP 784-128-256-10, batch 64, Adam,
    in-memory tensors), as on a GPU: what is measured is the work around the step. A plain PyTorch loop,
    a bare Lightning Trainer (same module and batches, no logger, checkpoint or progress) and the
    project through `train.py` with its default callbacks and CSV history (and `overrides`), each timed
    between the ends of the steps `window` of one run, inside epoch 0 (scripts/bench_clock.StepWindowClock):
    start-up, validation and the run's end stay out. Runs are interleaved and each repeat's ratios taken, so
    that drift in the machine's speed hits all three alike. `accelerator="gpu"`: all three on one GPU
    (scripts/gpu_bench.sh)."""
    import torch
    import torch.nn.functional as F
    from bench_clock import StepWindowClock

    from hydralight.data import MEAN, STD, MNISTDataModule
    from hydralight.tasks.nets import MLP

    # One thread everywhere: the arithmetic is not what is measured, and threads that wait for a shared
    # machine's cores would swamp the differences.
    torch.set_num_threads(1)
    device = torch.device("cuda" if accelerator == "gpu" else "cpu")
    val_size = 100 if smoke else 5000
    net_cfg = {"_target_": "hydralight.tasks.nets.MLP", "hidden": [128, 256]}
    first, last = window

    def datamodule() -> MNISTDataModule:
        return MNISTDataModule(data_dir, global_size=64, val_size=val_size, download=False)

    dm = datamodule()
    dm.setup("fit")
    images, labels = dm.splits["train"].images.to(device), dm.splits["train"].labels.to(device)

    def finished() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def plain() -> float:
        torch.manual_seed(0)
        model = MLP([128, 256]).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        order = torch.randperm(len(labels), device=device)
        start = 0.0
        for step in range(1, last + 1):
            idx = order[(step - 1) * 64 : step * 64]
            x = images[idx].float().div_(255.0).sub_(MEAN).div_(STD)
            loss = F.cross_entropy(model(x), labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step == first:
                start = finished()
        return (finished() - start) / (last - first) * 1000

    def lightning() -> float:
        clock = StepWindowClock(first, last, say=False)
        # A fresh data module on GPUs: set up inside `fit`, it keeps its tensors on the trainer's device.
        bare_lightning_seconds(net_cfg, datamodule() if device.type == "cuda" else dm, last, accelerator, (clock,))
        assert clock.ms_per_step is not None
        return clock.ms_per_step

    hardware = "hardware=1gpu" if accelerator == "gpu" else "hardware=cpu"

    def project() -> float:
        _, output = run(
            [*TRAIN, hardware, "model=mlp", "batch.global_size=64", "logger=csv", f"trainer.max_steps={last}",
             f"data.val_size={val_size}", "+callbacks.clock._target_=bench_clock.StepWindowClock",
             f"+callbacks.clock.first={first}", f"+callbacks.clock.last={last}", *overrides,
             f"hydra.run.dir={tempfile.mkdtemp(dir=out)}"],
            {"DATA_DIR": data_dir, "OMP_NUM_THREADS": "1", "PYTHONPATH": with_scripts()},
        )  # fmt: skip
        return float(re.findall(r"ms per step (\d+\.\d+)", output)[-1])

    loops = {"plain": plain, "lightning": lightning, "project": project}
    for loop in (plain, lightning):  # warm-up: first-call costs are not the loop's (each project run is a new process)
        loop()
    per_step: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(repeats):
        for name, loop in loops.items():
            per_step[name].append(loop())
    results: dict = {f"{name}_ms_per_step": summary(values) for name, values in per_step.items()}
    # Ratios of the runs of one repeat, measured seconds apart: the machine's drift between repeats cancels in
    # each, and the median of the ratios is the figure.
    for a, b in (("project", "lightning"), ("lightning", "plain")):
        paired = [x / y for x, y in zip(per_step[a], per_step[b], strict=True)]
        results[f"{a}_vs_{b}_by_repeat"] = summary(paired)
        results[f"{a}_vs_{b}"] = statistics.median(paired)
    results["steps"] = list(window)
    return results


def machine() -> str:
    import torch

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}"


def fmt(stat: dict, digits: int = 2) -> str:
    return f"{stat['median']:.{digits}f} (min {stat['min']:.{digits}f}, max {stat['max']:.{digits}f}, n={stat['n']})"


# How each benchmark measures, said beside its rows.
# experiment=fast against the plain floor, by thread count.
TIME_TO_99_GOALS = {"1": "<= 1.10", "2": "<= 1.15"}
METHODS = {
    "framework": "same FastCNN, batches and Adam, 300 steps each side, interleaved; 2 threads; median of pair ratios",
    "data": "200 batches of 128 through each loader",
    "time_to_99": "whole process, start to its `test/acc` line; seeds 0-9 x 1 and 2 threads, interleaved",
    "classic": "whole process, start to `test/acc`, once each",
    "startup": "whole process; first step: the clock of a callback (scripts/bench_clock.py)",
    "scaling": "steady steps after a fifth of 150, batch 128, model=fastcnn",
    "ddp_vs_plain": "whole process, start to its `test/acc` line; 2 processes of one thread, gloo; seeds 0 to "
    "repeats - 1, interleaved; the median of pair ratios",
    "keyed_dropout": "in one process, 50 steps each, interleaved; median of each repeat's ratio",
    "cheap_step": "steps 100 to 800 of one run (inside epoch 0) by a clock callback, interleaved; 1 thread; "
    "the median of each repeat's ratio",
    "sweeps": "whole process, start to Hydra's `#0 :` line (job 0 starting), 100 x 100 vs 2 x 2 grid, interleaved; "
    "the report: whole process over copies of one real job dir",
    "install": "two environments side by side (the project alone: pip install hydralight; the project with its dev "
    "extras), interleaved per seed 0 to repeats - 1: imports, experiment=fast and the plain floor whole process to "
    "`test/acc` (2 threads), the first step by a clock callback",
}


def rows_of(results: dict) -> list[tuple[str, str, str, str, str]]:
    """(benchmark key, row name, value, goal, figures) for each benchmark measured."""
    rows: list[tuple[str, str, str, str, str]] = []
    if (f := results.get("framework")) is not None:
        rows.append(("framework", "framework overhead: Lightning / plain loop", f"{f['ratio']:.3f}", "<= 1.05",
                     f"{fmt(f['lightning_s'])} s vs {fmt(f['plain_s'])} s for {f['steps']} steps"))  # fmt: skip
    if (d := results.get("data")) is not None:
        rows.append(("data", "data path: tensor / torchvision samples/s", f"{d['ratio']:.1f}x", ">= 20x",
                     f"{fmt(d['tensor_samples_per_s'], 0)} vs {fmt(d['torchvision_samples_per_s'], 0)}"))  # fmt: skip
    if (t := results.get("time_to_99")) is not None:
        for n, ratio in t["vs_plain"].items():
            fast, plain = (summary(t[side]["by_threads"][n]["seconds"]) for side in ("fast", "plain"))
            rows.append(("time_to_99", f"time to 99%: experiment=fast / plain floor, {n} thread{'s' * (n != '1')}",
                         f"{ratio:.2f}", TIME_TO_99_GOALS.get(n, "-"), f"{fmt(fast)} s vs {fmt(plain)} s"))  # fmt: skip
        accs = t["fast"]["test_acc"]
        rows.append(("time_to_99", "time to 99%: experiment=fast test acc, worst seed and thread count",
                     f"{min(accs):.4f}", ">= 0.991", f"mean {statistics.mean(accs):.4f} over {len(accs)} runs "
                     "(table below)"))  # fmt: skip
    if (c := results.get("classic")) is not None:
        rows.append(("classic", "time to 99%: classic recipe / experiment=fast", f"{c['speedup']:.1f}x", ">= 10x",
                     f"{c['classic_s']:.1f} s (acc {c['classic_acc']:.4f}) vs {c['fast_s']:.1f} s "
                     f"(acc {c['fast_acc']:.4f})"))  # fmt: skip
    if (s := results.get("startup")) is not None:
        rows += [
            ("startup", "start-up: `train.py --cfg job`", f"{s['cfg_job_s']['median']:.2f} s", "< 1 s", fmt(s["cfg_job_s"])),
            ("startup", "start-up: process start to first step (experiment=fast)", f"{s['first_step_s']['median']:.2f} s",
             "-", fmt(s["first_step_s"])),
            *([("startup", "start-up: first step beyond torch's own import", f"{s['first_step_beyond_torch_s']:.2f} s",
                "<= 1.0 s", f"{fmt(s['first_step_s'])} s vs `import torch` {fmt(s['torch_import_s'])} s")]
              if "torch_import_s" in s else []),
            *([("startup", "start-up: the plain floor's first step beyond torch's own import (torch alone)",
                f"{s['floor_first_step_beyond_torch_s']:.2f} s", "-",
                f"{fmt(s['floor_first_step_s'])} s vs `import torch` {fmt(s['torch_import_s'])} s")]
              if "floor_first_step_s" in s else []),
            *([("startup", "start-up: bare Lightning's first step beyond torch's own import (Lightning alone)",
                f"{s['bare_first_step_beyond_torch_s']:.2f} s", "-",
                f"{fmt(s['bare_first_step_s'])} s vs `import torch` {fmt(s['torch_import_s'])} s"),
               ("startup", "start-up: first step beyond bare Lightning's (what the project adds)",
                f"{s['first_step_beyond_bare_s']:.2f} s", "-",
                f"{fmt(s['first_step_s'])} s vs {fmt(s['bare_first_step_s'])} s")]
              if "bare_first_step_s" in s else []),
        ]  # fmt: skip
    if (p := results.get("scaling")) is not None:
        rows.append(("scaling", "DDP on CPU: 2 / 1 processes samples/s", f"{p['speedup']:.2f}x", "-",
                     f"{fmt(p['1_process_samples_per_s'], 0)} vs {fmt(p['2_process_samples_per_s'], 0)}; efficiency "
                     f"{p['efficiency']:.0%}, DDP overhead {p['ddp_overhead_ms_per_step']:.1f} ms/step"))  # fmt: skip
    if (q := results.get("ddp_vs_plain")) is not None:
        rows.append(("ddp_vs_plain", "DDP on CPU: experiment=fast on 2 processes / plain torch DDP", f"{q['ratio']:.2f}",
                     "<= 1.25", f"{fmt(q['project_s'])} s vs {fmt(q['plain_s'])} s; test acc "
                     f"{min(q['test_acc']['project']):.4f} at worst vs {min(q['test_acc']['plain']):.4f}"))  # fmt: skip
    if (k := results.get("keyed_dropout")) is not None:
        rows.append(("keyed_dropout", "keyed dropout: step with keyed / torch dropout", f"{k['ratio']:.3f}", "<= 1.15",
                     f"{fmt(k['keyed_ms_per_step'], 1)} vs {fmt(k['torch_ms_per_step'], 1)} ms per step "
                     "(SeedCNN, batch 128)"))  # fmt: skip
    if (c := results.get("cheap_step")) is not None:
        ms = {name: fmt(c[f"{name}_ms_per_step"]) for name in ("project", "lightning", "plain")}
        rows += [
            ("cheap_step", "cheap step: project / bare Lightning ms per step", f"{c['project_vs_lightning']:.2f}",
             "<= 1.10", f"{ms['project']} vs {ms['lightning']} ms (MLP 784-128-256-10, batch 64; the project with "
             f"its default callbacks and CSV history); ratio by repeat {fmt(c['project_vs_lightning_by_repeat'])}"),
            ("cheap_step", "cheap step: bare Lightning / plain loop ms per step", f"{c['lightning_vs_plain']:.2f}", "-",
             f"{ms['lightning']} vs {ms['plain']} ms; ratio by repeat {fmt(c['lightning_vs_plain_by_repeat'])}"),
        ]  # fmt: skip
    if (i := results.get("install")) is not None:
        rows += [
            ("install", "install: `import pytorch_lightning`, project alone / with its extras",
             f"{i['lightning_import_ratio']:.2f}", "-",
             f"{fmt(i['core_lightning_import_s'])} s vs {fmt(i['extras_lightning_import_s'])} s"),
            ("install", "install: experiment=fast / plain floor, project alone, 2 threads", f"{i['core_vs_plain']:.2f}",
             "<= 1.15", f"{fmt(i['core_fast_s'])} s vs {fmt(i['plain_s'])} s; with the extras "
             f"{fmt(i['extras_fast_s'])} s ({i['extras_vs_plain']:.2f}); test acc {min(i['test_acc']['core']):.4f} "
             "at worst"),
            ("install", "install: first step beyond torch's own import, project alone",
             f"{i['core_first_step_beyond_torch_s']:.2f} s", "<= 1.0 s",
             f"{fmt(i['core_first_step_s'])} s vs `import torch` {fmt(i['core_torch_import_s'])} s"),
        ]  # fmt: skip
    if (w := results.get("sweeps")) is not None:
        rows += [
            ("sweeps", f"sweeps: first job of a {w['grid_jobs']:,}-job / 4-job grid", f"{w['first_job_ratio']:.2f}",
             "10,000 jobs < 10 s", f"{fmt(w['first_job_large_s'])} s vs {fmt(w['first_job_small_s'])} s"),
            ("sweeps", f"sweeps: report over {w['report_jobs']:,} / 10 job dirs", f"{w['report_ratio']:.2f}",
             "seconds", f"{fmt(w['report_many_s'])} s vs {fmt(w['report_few_s'])} s"),
        ]  # fmt: skip
    return rows


def write_results(results: dict, out: Path, smoke: bool) -> None:
    # The figures first: a table that cannot be drawn from them loses nothing that was measured.
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    # Rows measured on another day may come from another machine of the same kind: each row says which.
    machines = sorted({r["machine"] for r in results.values()})
    label = {m: f"M{i + 1}" for i, m in enumerate(machines)}
    lines = [
        "# Benchmarks" + (" (smoke run: tiny sizes, numbers mean nothing)" if smoke else ""),
        "",
        "Machines: " + "; ".join(f"{label[m]} = {m}" for m in machines) + ".",
        "",
        "| benchmark | ratio / value | goal | measured (median, min, max) | method | date, machine |",
        "|---|---|---|---|---|---|",
        *[
            f"| {name} | {value} | {goal} | {figures} | {METHODS[key]} | {results[key]['measured']}, "
            f"{label[results[key]['machine']]} |"
            for key, name, value, goal, figures in rows_of(results)
        ],
    ]
    if (t := results.get("time_to_99")) is not None:
        lines += [
            "",
            f"## experiment=fast and the plain floor, test accuracy by seed and thread count ({t['measured']})",
            "",
            *recipe_table(t),
        ]
    lines += [
        "",
        "Reproduce: `make bench` (real MNIST in `DATA_DIR`); `python scripts/benchmark.py --smoke` checks the suite;",
        "`--only NAME,...` measures some again and keeps the others' rows with their dates. How the floor's recipe was",
        "found: `recipe_search.md`. Raw figures: `results.json`.",
    ]
    (out / "RESULTS.md").write_text("\n".join(lines) + "\n")
    plot(results, out / "results.png")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, c = results.get("time_to_99") or {}, results.get("classic") or {}
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    names = ["experiment=fast", "plain floor", "classic recipe"]
    values = [t.get("fast", {}).get("median", 0.0), t.get("plain", {}).get("median", 0.0), c.get("classic_s", 0.0)]
    a.barh(names, values, color=["tab:green", "tab:blue", "tab:gray"])
    a.set_xlabel("seconds, whole process")
    a.set_title("time to test accuracy")
    ratios = {"framework\n(Lightning/plain)": results.get("framework", {}).get("ratio", 0.0),
              "DDP speedup\n(2 vs 1 proc)": results.get("scaling", {}).get("speedup", 0.0)}  # fmt: skip
    b.bar(list(ratios), list(ratios.values()), color=["tab:orange", "tab:purple"])
    b.axhline(1.0, color="black", lw=0.8)
    b.set_title("ratios")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on generated data: proves the suite runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    parser.add_argument("--only", default=None, help="comma-separated benchmarks to measure again (e.g. keyed_dropout); "
                        "the others keep their figures from the last full run in --out")  # fmt: skip
    parser.add_argument("--core-python", default=None, help="the Python of an environment holding the project alone "
                        "(pip install hydralight, no extras): measures the install benchmark")  # fmt: skip
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-"))
    if args.smoke:
        sys.path.insert(0, str(ROOT / "tests"))
        from conftest import make_mnist

        data_dir = str(make_mnist(work / "smoke-data"))
        repeats, steps, batches = 1, 5, 3
    else:
        data_dir = os.environ.get("DATA_DIR", str(ROOT / "data"))
        repeats, steps, batches = args.repeats, 300, 200
    suite = {
        "framework": lambda: framework_overhead(data_dir, steps, repeats if args.smoke else 2 * repeats),
        "data": lambda: data_path(data_dir, batches, repeats),
        "time_to_99": lambda: time_to_99(data_dir, repeats, args.smoke, work),
        "classic": lambda: classic(data_dir, args.smoke, work),
        "startup": lambda: startup(data_dir, repeats, work),
        "scaling": lambda: scaling(data_dir, 10 if args.smoke else 150, repeats, work),
        "ddp_vs_plain": lambda: ddp_vs_plain(data_dir, repeats, args.smoke, work),
        "keyed_dropout": lambda: keyed_dropout(5 if args.smoke else 50, repeats if args.smoke else 2 * repeats),
        # A window inside epoch 0 (859 steps of 64); more repeats than the others: the differences are small.
        "cheap_step": lambda: cheap_step(
            data_dir, (2, 5) if args.smoke else (100, 800), repeats if args.smoke else 3 * repeats, work, args.smoke
        ),
        "sweeps": lambda: sweeps(data_dir, repeats, work, args.smoke),
        "install": lambda: install_extras(data_dir, repeats, work, args.smoke, args.core_python),
    }
    chosen = args.only.split(",") if args.only else list(suite)
    if args.core_python is None:  # no second environment to compare with: its row stays as last measured
        chosen = [name for name in chosen if name != "install"]
    earlier = json.loads((out / "results.json").read_text()) if args.only and (out / "results.json").is_file() else {}
    today = time.strftime("%Y-%m-%d")
    here = machine()
    results = {
        name: {**suite[name](), "measured": today, "machine": here} if name in chosen else earlier.get(name)
        for name in suite
    }
    results = {name: value for name, value in results.items() if value is not None}  # not measured yet
    write_results(results, out, args.smoke)
    print((out / "RESULTS.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
