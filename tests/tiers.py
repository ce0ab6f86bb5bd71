"""Which tier each end-to-end test runs in (issue 52; docs/contributing/test-tiers.md).

Three tiers, each one command:

- ``make test-fast``: the unit tests and the end-to-end tests in :data:`FAST`, one job per main
  user path (submit, a failure, status and logs, a script, a sweep, a study, preemption, a
  cancel, monitoring, TensorFlow, preflight): for working on the code.
- ``make test`` (the README's test command, what ``.ci/run`` runs): every test but those in
  :data:`FULL`, in stages (docs/contributing/test-tiers.md).
- ``make test-full``: everything.

:data:`FULL` holds repeats of a capability that CI already tests end to end along one axis: the
other launcher, the other backend, the other MPI or MPI-and-launcher combination, and a
control whose job only shows what another job shows. Each says which test keeps the
capability in CI. Nothing here is deleted: ``make test-full`` runs it.

An entry is a test's node id, or its function's id for every parameter of it. The conftest
refuses an entry that names no test of a file it collected (a rename would drop it silently).
"""

FAST = (
    "tests/test_cluster.py",
    "tests/test_e2e.py",
    "tests/test_e2e_docs.py::test_the_quickstarts_lines_that_submit_nothing_run_as_written",
    "tests/test_e2e_ending.py::test_a_raising_rank_ends_the_job_at_once_and_runs_says_where[srun]",
    "tests/test_e2e_locks.py::test_a_project_template_adds_no_option_the_job_did_not_ask_for",
    "tests/test_e2e_monitor.py::test_monitored_job_records_utilisation_and_prometheus[torch]",
    "tests/test_e2e_preflight.py::test_a_bar_the_link_reaches_lets_the_job_train",
    "tests/test_e2e_reliability.py::test_two_preemptions_in_a_row_lose_and_repeat_nothing",
    "tests/test_e2e_runs.py::test_cancel_stops_a_running_job_and_its_ranks",
    "tests/test_e2e_script_words.py::test_a_script_that_does_not_compile_never_reaches_slurm",
    "tests/test_e2e_script_words.py::"
    "test_a_script_that_raises_is_named_in_the_headline_with_its_last_frames",
    "tests/test_e2e_study.py::test_study_commands_take_relative_paths_as_the_help_shows",
    "tests/test_e2e_sweep.py::test_a_sweep_runs_as_one_array_and_a_cancelled_element_runs_again",
    "tests/test_e2e_train.py::test_tensorflow_resnet_two_ranks_and_resume",
    "tests/test_e2e_user.py::test_script_mode_runs_the_users_script[digits-script-torch.yaml]",
    "tests/test_e2e_user.py::test_a_bad_reference_is_refused_before_slurm",
)

FULL = {
    # ---- the scale: 16 nodes and ranks on a 2-core machine (issue 53)
    "tests/test_e2e_scale.py":
        "test_e2e_script_stragglers' rank 0 working 60 s after its last step and test_e2e_fabric's "
        "cut link, at 2 nodes; bench/scale.py's stall at up to 32 ranks",
    # ---- the other backend: TensorFlow trains, resumes, is monitored, charted and preempted in CI
    "tests/test_e2e_study.py::test_weak_scaling_study[tensorflow]":
        "the torch study; TensorFlow's study point: the Debian 13 tier",
    "tests/test_e2e_user.py::test_digits_example_reaches_a_believable_accuracy":
        "test_user_model_resumes_and_continues_its_schedule: its second job is the torch example "
        "run to its end, with the same checks; TensorFlow's user code: "
        "test_script_mode_runs_the_users_script",
    "tests/test_e2e_user.py::test_script_mode_preemption_requeues_and_resumes[digits-script-tf]":
        "[digits-script-torch]; a TensorFlow resume: test_tensorflow_resnet_two_ranks_and_resume",
    "tests/test_e2e_monitor.py::test_a_timeline_window_is_copied_next_to_the_results[tensorflow]":
        "[torch]; TensorFlow monitored: test_monitored_job_records_utilisation_and_prometheus",
    "tests/test_e2e_tensorboard.py::test_a_managed_job_charts_what_results_json_records"
    "[tensorflow]": "[torch]",
    "tests/test_e2e_live.py::test_live_loss_is_the_global_mean_of_its_step[tensorflow-40]":
        "[torch-120]",
    # ---- the other launcher: srun runs jobs in CI (test_e2e::test_srun_pmix..., ending[srun])
    "tests/test_e2e_user.py::test_ranks_that_never_train_a_step_end_the_job_naming_where[srun]":
        "[mpirun]",
    "tests/test_e2e_train.py::test_a_dead_rank_ends_the_job_within_a_minute[srun]":
        "[mpirun]; srun's end of a failed rank: test_e2e_ending[srun]",
    "tests/test_e2e_fabric.py::test_horovods_traffic_crosses_the_shaped_link[srun]": "[mpirun]",
    "tests/test_e2e_preflight.py::"
    "test_a_bar_no_link_reaches_ends_the_job_with_exit_2_before_training[srun]": "[mpirun]",
    "tests/test_e2e_ranks.py::test_two_ranks_on_one_gpu_are_refused_unless_sharing_is_meant[srun]":
        "[mpirun]",
    "tests/test_e2e_gpu.py::test_each_rank_sees_exactly_its_own_gpu[per-node-srun-srun-"
    "gpus_per_node: 2-own of the node's 0,1]": "[per-node-mpirun...] and [per-task-srun...]",
    "tests/test_e2e_gpu.py::test_each_rank_sees_exactly_its_own_gpu[bind-single-srun-srun-"
    "gpus_per_node: 2, binding: {gpu_bind: 'single:1'}-as Slurm gave it]":
        "[per-task-srun...]: Slurm's own binding",
    "tests/test_e2e_gpu.py::test_two_nodes_of_two_ranks_train[no-gpus-mpirun]": "[gpus-mpirun]",
    "tests/test_e2e_gpu.py::test_two_nodes_of_two_ranks_train[no-gpus-srun]": "[gpus-mpirun]",
    "tests/test_e2e_gpu.py::test_two_nodes_of_two_ranks_train[gpus-srun]": "[gpus-mpirun]",
    # ---- the other MPI and launcher combinations: each MPI runs Horovod in CI once per launcher
    "tests/test_e2e_mpis.py::test_the_quickstart_trains_with_each_mpi_under_each_launcher":
        "test_a_2x2_job_is_preempted_requeued_and_names_its_slow_rank[openmpi5-srun, "
        "mpich-mpirun]: each MPI trains, is preempted and resumes",
    "tests/test_e2e_mpis.py::test_a_2x2_job_is_preempted_requeued_and_names_its_slow_rank"
    "[openmpi5-mpirun]": "[openmpi5-srun]; Open MPI 5's mpirun: the install test's quickstart",
    "tests/test_e2e_mpis.py::test_a_2x2_job_is_preempted_requeued_and_names_its_slow_rank"
    "[mpich-srun]": "[mpich-mpirun]; MPICH under srun: test_e2e_mpi_lines[mpich-srun]",
    "tests/test_e2e_mpi_lines.py::test_a_rank_on_each_node_allreduces_under_the_mpis_launcher"
    "[openmpi5-mpirun]": "test_e2e_mpis with Horovod, and the install test's quickstart",
    "tests/test_e2e_mpi_lines.py::test_a_rank_on_each_node_allreduces_under_the_mpis_launcher"
    "[mpich-mpirun]": "test_e2e_mpis[mpich-mpirun] with Horovod",
    # ---- a variant or a control whose job another test already runs
    "tests/test_e2e_script_words.py::test_a_failed_preflight_is_named_in_the_headline":
        "test_e2e_preflight::test_a_bar_no_link_reaches_ends_the_job_with_exit_2_before_training"
        "[mpirun]: the same job, the same headline",
    "tests/test_e2e_study.py::test_the_bundle_alone_runs_the_study_again_elsewhere":
        "test_study_commands_take_relative_paths_as_the_help_shows: rerun and compare of a "
        "study's bundle",
    "tests/test_e2e_truth.py::"
    "test_a_resubmitted_element_keeps_max_parallel_and_never_ran_is_named_alike":
        "test_max_parallel_2_holds_when_an_element_is_resubmitted_while_two_run",
    "tests/test_e2e_nonroot.py::test_a_sweep_and_a_study_point_run_as_the_user":
        "the user's quickstart and preempted job; sweeps and studies as root",
    "tests/test_e2e_user.py::test_a_rank_that_never_reaches_horovods_init_leaves_the_other_"
    "inside_it": "test_ranks_that_never_train_a_step_end_the_job_naming_where[mpirun]: the "
                 "startup watch",
}


def matches(nodeid: str, entry: str) -> bool:
    """Whether the test ``nodeid`` is the one ``entry`` names (a file, a function with all its
    parameters, or one parametrised case)."""
    return nodeid == entry or nodeid.startswith(entry + "[") or nodeid.startswith(entry + "::")


def tier_of(nodeid: str) -> set[str]:
    """The tier markers the test ``nodeid`` gets: ``fast``, ``full``, or none (CI's)."""
    marks = set()
    if any(matches(nodeid, e) for e in FAST):
        marks.add("fast")
    if any(matches(nodeid, e) for e in FULL):
        marks.add("full")
    return marks


def stale(nodeids: list[str]) -> list[str]:
    """Entries of :data:`FAST` and :data:`FULL` that name no test of a file collected."""
    files = {n.split("::")[0] for n in nodeids}
    return [e for e in (*FAST, *FULL) if e.split("::")[0] in files
            and not any(matches(n, e) for n in nodeids)]
