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


def test_a_best_checkpoint_path_leading_out_of_the_folder_is_left_out(tmp_path):
    """A crafted last.ckpt named a file outside as a best checkpoint (`../`, or a link in the folder): Lightning
    removed it when a better one came (any file the user could write)."""
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "epoch000.ckpt").write_bytes(b"x")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (folder / "link.ckpt").symlink_to(victim)
    escape = str(folder / ".." / ".." / "victim.txt")
    for old in (str(folder), str(tmp_path / "elsewhere" / "checkpoints")):  # saved here, and in a moved run
        escape_from_old = escape.replace(str(folder), old)
        state = {
            "dirpath": old,
            "best_model_path": escape_from_old,
            "best_model_score": 0.0,
            "best_k_models": {escape_from_old: 0.0, f"{old}/link.ckpt": 0.1, f"{old}/epoch000.ckpt": 0.9},
            "kth_best_model_path": escape_from_old,
            "last_model_path": "",
        }
        moved_with_the_run(state, str(folder))
        assert state["best_k_models"] == {str(folder / "epoch000.ckpt"): 0.9}, old
        assert state["best_model_path"] == state["kth_best_model_path"] == "" and state["best_model_score"] is None
    assert victim.read_text() == "keep me"
