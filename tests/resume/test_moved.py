"""A checkpoint callback's saved state when the run dir was moved or copied since it was saved."""

from hydralight.resume.state import moved_with_the_run


def test_the_best_checkpoints_are_found_where_the_run_now_lies(tmp_path):
    old, new = tmp_path / "old" / "checkpoints", tmp_path / "new" / "checkpoints"
    new.mkdir(parents=True)
    (new / "epoch000.ckpt").write_bytes(b"x")
    state = {
        "dirpath": str(old),
        "best_model_path": str(old / "epoch000.ckpt"),
        "best_model_score": 0.9,
        "best_k_models": {str(old / "epoch000.ckpt"): 0.9, str(old / "gone.ckpt"): 0.5},
        "kth_best_model_path": str(old / "gone.ckpt"),
        "last_model_path": "",
    }
    moved_with_the_run(state, str(new))
    assert state["dirpath"] == str(new) and state["best_model_path"] == str(new / "epoch000.ckpt")
    # A file not found here is forgotten: nothing of the old folder is read, or removed as no longer the best.
    assert state["best_k_models"] == {str(new / "epoch000.ckpt"): 0.9} and state["kth_best_model_path"] == ""


def test_a_run_that_stayed_where_it_was_is_left_as_saved(tmp_path):
    state = {"dirpath": str(tmp_path), "best_model_path": str(tmp_path / "missing.ckpt"), "best_k_models": {}}
    saved = dict(state)
    moved_with_the_run(state, str(tmp_path))
    assert state == saved
