"""The launchers' own decisions, in-process: the GPUs each local job gets, a job's progress read from its dir."""


def test_local_jobs_side_by_side_get_gpus_of_their_own():
    from hydralight.launch.launchers import device_assignment

    assert device_assignment([1, 1, 1, 1], [0, 1, 2, 3]) == [[0], [1], [2], [3]]
    assert device_assignment([2, 2, 1], [0, 1, 2, 3]) == [[0, 1], [2, 3], [0]]  # more than there are: shared
    assert device_assignment([1, 0, 1], [4, 6]) == [[4], [], [6]]  # CUDA_VISIBLE_DEVICES=4,6 of the launcher
    assert device_assignment([1, 1], []) == [[], []]


def test_a_job_s_progress_is_the_step_of_its_last_history_row(tmp_path):
    from hydralight.launch.launchers import _reached

    assert _reached(tmp_path) == ""  # no history yet
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("epoch,step,train/loss\n0,1,2.3\n0,2,2.1\n")
    assert _reached(tmp_path) == ", at step 2"
