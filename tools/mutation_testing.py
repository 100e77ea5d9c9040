"""Mutation testing of the modules that carry hpctrain's promises, with cosmic-ray.

Each module is mutated one small change at a time (a comparison flipped, a number changed, a
condition negated, ``and`` for ``or``, a loop that never runs, ...) and the fast tests that
cover it are run against every mutant: a mutant the tests still pass is a bug they would let
through. Run through ``tools/mutation`` (which installs the pinned tool).

Why cosmic-ray: it mutates the real file and runs an ordinary test command, so the tests run
exactly as in the suite (their conftest, real fixtures). To leave the working tree alone, the
work happens in a copy of it (the files git tracks or would track) in the work folder.

Binary operators replaced by bit, shift, power or modulo operators, and ordering comparisons
replaced by identity tests (``<`` -> ``is``), are left out: nobody writes those by mistake,
and they would triple the run for no realistic bug.

``EQUIVALENT`` lists the mutants that cannot change what a user sees, each with why; they are
reported apart and do not count in the score (killed / (mutants - equivalent)).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# the preflight checks' unit tests (captured tool output, no Slurm), and the runners' tests
# that drive fake nvidia-smi/ibstat scripts (the CLI's own tests start processes: left out)
_PREFLIGHT_UNIT = ["tests/preflight/test_checks.py", "tests/preflight/test_parsers.py"]
_PREFLIGHT_RUNNERS = [f"tests/preflight/test_runners_and_cli.py::test_{name}" for name in (
    "healthy_node_through_fake_tools", "degraded_node_through_fake_tools",
    "missing_tools_give_rows_not_tracebacks", "query_retries_without_a_field_the_driver_rejects",
    "a_driver_that_knows_the_clock_reasons_only_by_their_new_name",
    "topology_runner_reports_a_broken_nvidia_smi")]

# key -> (module, the fast tests that cover it: files or pytest node ids)
MODULES: dict[str, tuple[str, list[str]]] = {
    "requeue": ("hpctrain/record/requeue_policy.py", ["tests/runs/test_requeue_policy.py"]),
    "exit_codes": ("hpctrain/exit_codes.py", [
        "tests/runs/test_exit_codes.py", "tests/scheduler/test_slurm_parsers.py",
        "tests/scheduler/test_local_exits.py", "tests/runs/test_requeue_policy.py"]),
    "attempt_end": ("hpctrain/record/attempt_end.py", [
        f"tests/runs/test_runs_and_attempts.py::test_{name}" for name in (
            "finish_attempt_merges_result_and_decides",
            "finish_attempt_without_result_uses_the_exit_code",
            "a_kill_after_the_final_checkpoint_does_not_undo_a_finished_attempt",
            "a_rank_failing_before_the_final_save_is_a_failure_even_if_rank_0_finished",
            "a_failed_attempt_names_the_rank_that_failed_first",
            "failure_records_do_not_rename_an_attempt_that_was_preempted",
            "a_cancel_event_prevents_requeue",
            "records_read_older_files_and_keep_what_they_do_not_know",
            "an_attempt_stopped_by_its_time_limit_is_recorded_as_such_and_requeued",
            "a_hang_under_the_local_executor_is_recorded_and_not_requeued",
            "the_recovery_is_measured_from_the_attempt_just_before",
            "a_half_written_failure_record_does_not_hide_the_others",
            "a_rank_killed_by_srun_is_named_in_the_record_over_the_peers_that_wrote_theirs",
            "an_in_job_restart_records_how_it_began_and_what_it_cost",
            "an_attempt_killed_while_writing_its_result_and_the_one_after_it",
            "a_restart_that_resumes_where_the_failed_attempt_stopped_lost_no_step")] + [
        "tests/scheduler/test_batch_steps.py::"
        "test_an_attempt_whose_batch_shell_was_killed_is_recorded_when_the_next_begins"]),
    "hang": ("hpctrain/health/hang.py", ["tests/health/test_hang_attribution.py"]),
    "culprit": ("hpctrain/record/culprit.py", ["tests/health/test_culprit.py"]),
    "stragglers": ("hpctrain/health/stragglers.py", ["tests/health/test_stragglers.py"]),
    "node_exclusion": ("hpctrain/scheduler/slurm/node_exclusion.py",
                       ["tests/scheduler/test_node_exclusion.py"]),
    "nccl_transport": ("hpctrain/preflight/nccl_log.py",
                       ["tests/preflight/test_checks.py", "tests/preflight/test_parsers.py"]),
    # test_collective.py runs the measurement across processes (minutes): left out
    "bandwidth": ("hpctrain/preflight/bandwidth.py",
                  _PREFLIGHT_UNIT + ["tests/preflight/test_bandwidth_rows.py"]),
    "infiniband": ("hpctrain/preflight/infiniband.py",
                   ["tests/preflight/test_checks.py", "tests/preflight/test_parsers.py"]),
    "bandwidth_rows": ("hpctrain/preflight/bandwidth_rows.py",
                       ["tests/preflight/test_bandwidth_rows.py"]),
    "checkpoint_store": ("hpctrain/record/checkpoint_store.py",
                         ["tests/runtime/test_checkpoint_store.py"]),
    "microbatches": ("hpctrain/data/gpt_dataset.py", [
        "tests/data/test_indexed_and_prepare.py::"
        "test_gpt_samples_order_is_seeded_and_dp_slices_tile_the_global_batch",
        "tests/data/test_indexed_and_prepare.py::"
        "test_every_sample_of_a_step_is_read_once_over_the_ranks_whatever_the_micro_batch",
        "tests/data/test_indexed_and_prepare.py::"
        "test_every_sample_is_whole_when_the_corpus_ends_on_a_sample_boundary",
        "tests/data/test_indexed_and_prepare.py::"
        "test_a_corpus_of_exactly_one_sample_trains_on_it_every_step",
        "tests/data/test_indexed_and_prepare.py::"
        "test_token_ids_up_to_the_vocabulary_train_and_one_beyond_is_refused",
        "tests/data/test_indexed_and_prepare.py::"
        "test_a_resume_in_the_second_epoch_and_repeated_evaluations_read_the_same_samples",
        "tests/data/test_indexed_and_prepare.py::"
        "test_a_split_too_small_for_one_sample_says_so_and_how_to_fix_it"]),
    "order": ("hpctrain/data/order.py", ["tests/data/test_sample_order_reference.py",
              "tests/data/test_order_tokenizers_workers.py::"
              "test_runs_saved_with_the_former_order_keep_it"]),
    "flops": ("hpctrain/flops.py", ["tests/plan/test_flops_megatron.py",
                                    "tests/runtime/test_pure_logic.py"]),
    "render": ("hpctrain/scheduler/slurm/render.py", ["tests/scheduler/test_render_kinds.py"] + [
        f"tests/scheduler/test_render.py::test_{name}" for name in (
            "rendered_script_matches_golden_file", "render_is_pure",
            "directives_follow_the_profile", "hostile_values_are_inert",
            "render_cli_refuses_local_profile", "step_script_of_a_job_that_trains_nothing")]),
    "gpu_check": ("hpctrain/preflight/gpu.py", _PREFLIGHT_UNIT + _PREFLIGHT_RUNNERS),
    "nccl_env": ("hpctrain/preflight/nccl_env.py", _PREFLIGHT_UNIT),
    "topology": ("hpctrain/preflight/topology.py", _PREFLIGHT_UNIT + _PREFLIGHT_RUNNERS),
    "storage": ("hpctrain/preflight/storage.py",
                _PREFLIGHT_UNIT + ["tests/preflight/test_storage_probe.py"]),
    # the step model's tests against a real megatron-core step (a probe process, 15 s): left out
    "planner_timing": ("hpctrain/planner/timing.py", [
        f"tests/plan/test_plan_step_model.py::test_{name}" for name in (
            "a_grid_point_is_exact_and_a_power_law_rate_is_interpolated_exactly",
            "the_step_is_priced_kernel_by_kernel_from_the_table",
            "the_plan_follows_from_the_step_time",
            "tensor_parallel_communication_is_charged_where_megatron_core_exposes_it",
            "a_table_that_is_not_a_full_grid_is_refused_by_name",
            "a_profile_names_its_table_and_the_plan_uses_it",
            "the_local_specs_fused_attention_is_priced_by_the_torch_kernel_that_runs_it",
            "a_step_with_little_gpu_work_per_layer_is_said_to_be_bound_by_the_host")] + [
        "tests/plan/test_plan_gpu_captured.py",
        "tests/plan/test_plan_cost.py", "tests/plan/test_flops_megatron.py",
        "tests/plan/test_plan_optimizer_step.py::"
        "test_the_plan_counts_the_larger_of_the_activations_and_the_step_copy"]),
    "planner_activations": ("hpctrain/planner/activations.py", [
        "tests/plan/test_plan_activation_formulas.py", "tests/plan/test_plan_memory_tables.py",
        "tests/plan/test_plan_memory_ranks.py", "tests/plan/test_plan_published_layouts.py",
        "tests/plan/test_plan_save_memory.py", "tests/plan/test_plan_gpu_captured.py"]),
    "planner_memory": ("hpctrain/planner/memory.py", ["tests/plan/test_plan_memory_tables.py",
                                                      "tests/plan/test_plan_memory_ranks.py"]),
    # the layout search and the checkpoint save's memory and time: the planner's unit tests
    # and its CLI in process (the real-megatron probes, minutes each, are left out)
    "planner_layouts": ("hpctrain/planner/layouts.py", [
        "tests/plan/test_plan_layout_search.py", "tests/plan/test_plan_published_layouts.py",
        "tests/plan/test_plan_save_memory.py",
        "tests/plan/test_plan_checkpoint_interval.py", "tests/plan/test_plan_cli.py",
        "tests/plan/test_training_cost.py",
        "tests/plan/test_plan_optimizer_step.py::"
        "test_the_plan_counts_the_larger_of_the_activations_and_the_step_copy"]),
    "save_memory": ("hpctrain/planner/save_memory.py", [
        "tests/plan/test_plan_save_memory.py", "tests/plan/test_plan_checkpoint_interval.py"]),
    "save_time": ("hpctrain/planner/save_time.py", [
        "tests/plan/test_plan_checkpoint_interval.py", "tests/plan/test_plan_save_memory.py"]),
    # the value checks in process; test_bad_files.py and test_script_injection.py run the CLI
    # (a process per case, minutes per mutant) and kill more
    "safety": ("hpctrain/config/safety.py", ["tests/safety/test_value_checks.py"]),
    # the one door every file hpctrain did not write goes through, and the run-folder reader
    # on top of it (the CLI tests of damaged run folders start processes: left out)
    "file_door": ("hpctrain/file_door.py", [
        "tests/safety/test_file_door.py", "tests/runs/test_run_reader.py",
        "tests/plan/test_kernel_table_door.py"]),
    # a profile's kernel table: its file, or one hpctrain ships (builtin:NAME)
    "kernel_table": ("hpctrain/config/kernel_table.py", [
        "tests/plan/test_kernel_table_door.py"] + [
        f"tests/plan/test_plan_step_model.py::test_{name}" for name in (
            "a_table_that_is_not_a_full_grid_is_refused_by_name",
            "a_profile_names_its_table_and_the_plan_uses_it",
            "a_profile_names_a_table_hpctrain_ships_and_nothing_else_by_that_prefix")]),
    "reader": ("hpctrain/record/reader.py", [
        "tests/runs/test_run_reader.py", "tests/runs/test_hostile_records.py"]),
    # the checkpoint's host staging memory: placement, lifetime, page-locking and its order
    "staging": ("hpctrain/runtime/checkpoint/staging.py", [
        "tests/runtime/test_checkpoint_staging.py"]),
    # the resume's parallel read: every item verified in the pass, the bytes torch's reader
    # would load, the memory given back
    "resume_reader": ("hpctrain/runtime/checkpoint/reader.py", [
        "tests/runtime/test_resume_reader.py", "tests/runtime/test_resume_streaming.py",
        "tests/runtime/test_checkpoint_staging.py"]),
    # one item: its length and CRC32C checked, its tensor's record found (whole or by its tail)
    "resume_items": ("hpctrain/runtime/checkpoint/items.py", [
        "tests/runtime/test_resume_reader.py", "tests/runtime/test_resume_streaming.py"]),
    # the streaming path: chunks in order, every byte checksummed, record bytes where they go
    "resume_streaming": ("hpctrain/runtime/checkpoint/streaming.py", [
        "tests/runtime/test_resume_streaming.py", "tests/runtime/test_resume_reader.py"]),
    # a save's staging and writing: the checksum of the bytes meant to be written, per item
    # and per file, the staged copy written, a storage error naming its file
    "checkpoint_writer": ("hpctrain/runtime/checkpoint/writer.py", [
        "tests/runtime/test_resume_reader.py", "tests/runtime/test_checkpoint_staging.py",
        "tests/runtime/test_save_faults.py"]),
    # the experiment trackers' thread: only what a checkpoint holds is sent, an attempt after
    # a failure sends what the one before left, a failing tracker is retried, nothing waits
    "tracker_thread": ("hpctrain/tracking/sender.py", [
        "tests/tracking/test_tracker_thread.py", "tests/tracking/test_tracking_logic.py"]),
    # the multi-rank stop decisions: the preemption flag (signals, the batch shell's flag
    # file), the deadline, the save estimate and periodic saves that rank 0's clocks vote with
    "preemption": ("hpctrain/runtime/preemption.py", [
        "tests/runtime/test_pure_logic.py", "tests/runtime/test_gpu_path_logic.py",
        "tests/runtime/test_checkpoint_interval.py"]),
    # the save interval chosen from measured save and failure times (train.save_interval: auto)
    "save_interval": ("hpctrain/runtime/save_interval.py", [
        "tests/runtime/test_checkpoint_interval.py"]),
    # the straggler watch in the ranks: the log step's all-gather and the one decision
    "straggler_watch": ("hpctrain/runtime/straggler_timing.py", [
        "tests/runtime/test_straggler_watch.py"]),
    # the runtime's own collectives: rank 0's work ending alike on every rank, the gathers
    "collectives": ("hpctrain/runtime/collectives.py", [
        "tests/runtime/test_rank0_errors.py", "tests/runtime/test_straggler_watch.py"]),
    # the loss-spike guard every rank judges alike, whose state a resume carries on
    "guard": ("hpctrain/runtime/guard.py", ["tests/runtime/test_pure_logic.py"]),
    # recovery inside the allocation: whom to blame, which spare takes the node's place, when
    # the requeue path goes first, the old step gone before the new one starts
    "in_job_restart": ("hpctrain/scheduler/slurm/in_job_restart.py", [
        "tests/scheduler/test_in_job_restart.py", "tests/scheduler/test_batch_steps.py"]),
    # a run's folder over its attempts: the next attempt's number, the ledger's records
    # rewritten in place, whether a person cancelled or reopened it, whether it finished
    "run_folder": ("hpctrain/record/folder.py", [
        "tests/runs", "tests/scheduler/test_batch_steps.py", "tests/ops/test_run_state.py",
        "tests/safety/test_printable_output.py"]),
    # the batch shell's hang watch: the verdict, the ranks' dumps, the step killed if needed
    "hang_watch": ("hpctrain/scheduler/slurm/hang_watch.py", [
        "tests/scheduler/test_hang_watch.py", "tests/health/test_hang_attribution.py"]),
    # every rank's own hang watch: its limit, its beats, the verdict it claims and acts on
    "watchdog": ("hpctrain/runtime/watchdog.py", [
        "tests/health/test_hang_attribution.py", "tests/runtime/test_watchdog_acts.py",
        "tests/runtime/test_health_in_ranks.py", "tests/runtime/test_native_dump.py"]),
    # the batch shell's steps: the signal passed on or deferred, the attempt begun, its end
    # recorded and the requeue or in-job restart decided, the requeue without bad nodes
    "batch_steps": ("hpctrain/scheduler/slurm/batch_steps.py", [
        "tests/scheduler/test_batch_steps_stories.py", "tests/scheduler/test_batch_steps.py",
        "tests/scheduler/test_in_job_restart.py"]),
    # a save that fails on the storage or loses a peer, said in one line that names what to do
    "save_faults": ("hpctrain/runtime/checkpoint/save_faults.py", [
        "tests/runtime/test_save_faults.py"]),
    # what each rank's forward step is fed: its DP slice of every global batch, from where
    # the run resumed; TP rank 0 reads, its peers receive; the loss and the step's loss
    "batches": ("hpctrain/runtime/batches.py", ["tests/runtime/test_batches.py"]),
    # a blend of several corpora: each keeps its share and its own order, any position found
    # again after a resume; the splits' documents
    "blend": ("hpctrain/data/blend.py", ["tests/data/test_blends_and_splits.py"]),
    # the run folder's file primitives: the lock every read-modify-write holds, appends that
    # never interleave, a torn last line closed before the next, a folder removed whole
    "run_files": ("hpctrain/record/files.py", [
        "tests/runs/test_run_files.py", "tests/safety/test_run_file_writes.py",
        "tests/runs/test_runs_index.py"]),
    # where Adam keeps its step count, and setting it on resume for every optimizer class
    "optimizer_step": ("hpctrain/runtime/checkpoint/optimizer_step.py", [
        "tests/runtime/test_optimizer_step.py"]),
    # an attempt's records (rank 0's result, a failing rank's, the ledger line), read by
    # every later attempt and by older and newer versions of hpctrain
    # the validation and test loss: the split's first batches, one reporter per DP replica,
    # eval mode, stopped on every rank by a signal on any rank or by rank 0's time limit
    "evaluation": ("hpctrain/runtime/evaluation.py", ["tests/runtime/test_evaluation.py"]),
    # one run as a user sees it over its attempts: its state from the scheduler, the ledger
    # and the events; its step, loss, attempts; a damaged run listed, not hiding the others
    "run_view": ("hpctrain/view/runview.py", [
        "tests/ops/test_run_state.py", "tests/ops/test_status_and_report_offline.py",
        "tests/runs/test_summary_cache.py", "tests/runs/test_runs_index.py"]),
    # GPU-hours a run used over its attempts and requeues: Slurm's accounting for many runs
    # in one call, else each attempt's time on the ranks it ran
    "gpu_hours": ("hpctrain/view/cost.py", [
        f"tests/ops/test_gpu_hours.py::test_{name}" for name in (
            "without_accounting_the_ledger_times_the_ranks",
            "one_accounting_call_costs_many_runs_and_the_others_fall_back_to_their_ledgers",
            "the_ledger_counts_each_attempt_on_the_ranks_it_ran",
            "without_sacct_every_run_is_costed_from_its_ledger",
            "accounting_rows_count_gpus_per_incarnation")]),
    # the one place Slurm's commands run: their output read (squeue, sacct, scontrol, srun's
    # task exits, durations), a job id checked before scancel or scontrol acts on it
    "slurm_commands": ("hpctrain/scheduler/slurm/commands.py", [
        "tests/scheduler/test_slurm_commands.py", "tests/scheduler/test_slurm_parsers.py",
        "tests/ops/test_parsers_and_formatting.py",
        "tests/scheduler/test_node_exclusion.py", "tests/scheduler/test_in_job_restart.py",
        "tests/scheduler/test_batch_steps_stories.py", "tests/runs/test_runs_and_attempts.py"]),
    # saving and resuming across the ranks and attempts of a run: background saves published
    # one at a time, pruning, a resume that gives back the state, damaged checkpoints set
    # aside (caught before or while loading), another run's folder refused on every rank
    "checkpoint_manager": ("hpctrain/runtime/checkpoint/manager.py", [
        "tests/runtime/test_checkpointer.py", "tests/runtime/test_rank0_errors.py",
        "tests/runtime/test_save_faults.py"]),
    # what a checkpoint holds and getting it back into a fresh model and optimizer: the
    # distributed optimizer's two formats, megatron-core's four fixes, Adam's step count
    "checkpoint_state": ("hpctrain/runtime/checkpoint/state.py", [
        "tests/runtime/test_checkpointer.py", "tests/runtime/test_optimizer_step.py"]),
    # what a person does to a run by hand: cancel (recorded first, every live job of every
    # kind), requeue in place or by a new job, resume elsewhere or for more steps, refusals
    # that change nothing
    "ops_control": ("hpctrain/ops/control.py", ["tests/ops/test_control_stories.py"]),
    # the training loop's decisions on every rank over a run's attempts: a signal on one
    # rank, rank 0's time limit (between steps and in an evaluation), evaluations cut short
    # and done again, the guard's skips, saves, and a resumed run that trains bit for bit
    "loop": ("hpctrain/runtime/loop.py", ["tests/runtime/test_training_loop.py"]),
    # one attempt's parts built in the runtime's one order (resume before metrics, the
    # resumed sample order before the evaluator), as the loop's stories build each attempt
    "assembly": ("hpctrain/runtime/assembly.py", [
        "tests/runtime/test_attempt_assembly.py", "tests/runtime/test_training_loop.py"]),
    # rank 0's metrics: each interval's mean step time, throughput and MFU, what a record,
    # TensorBoard and the progress line hold, and nothing written by the other ranks
    "metrics": ("hpctrain/runtime/metrics.py", ["tests/runtime/test_metrics_records.py"]),
    # what a checkpoint's data position means, and the one comparison that refuses a resume
    # changing it (at the CLI and in the ranks)
    "fingerprint": ("hpctrain/data/fingerprint.py", [
        "tests/data/test_data_fingerprint.py", "tests/ops/test_resume_data_position.py"]),
    # prepared data accepted only for the tokenizer and sources the job names
    "prepared": ("hpctrain/data/prepared.py", ["tests/data/test_prepared_door.py",
                                                "tests/data/test_indexed_and_prepare.py"]),
    "attempt_records": ("hpctrain/record/attempt_records.py", [
        "tests/runs/test_runs_and_attempts.py", "tests/runs/test_requeue_policy.py",
        "tests/health/test_culprit.py"]),
    "cleanup": ("hpctrain/ops/cleanup.py", ["tests/ops/test_cleanup_door.py",
                                           "tests/cli/test_rough_edges.py"]),
    "submission_folders": ("hpctrain/submission/folders.py", [
        "tests/scheduler/test_refused_submission.py", "tests/runs/test_checkpoint_location.py",
        "tests/runs/test_sweep_folder.py"]),
}

# Operators left out (see the module docstring).
SKIPPED_OPERATORS = re.compile(
    r"core/ReplaceBinaryOperator_\w+_(Pow|LShift|RShift|BitOr|BitAnd|BitXor|Mod)$"
    r"|core/ReplaceComparisonOperator_(Lt|LtE|Gt|GtE)_(Is|IsNot)$"
    r"|core/ReplaceComparisonOperator_(Is|IsNot)_(Lt|LtE|Gt|GtE)$")

# (module, operator, the mutated line's source, stripped) -> why it is equivalent
_ENUM = ("exit reasons are ExitReason members (the records' from_dict and reason_for make them "
         "so), and enum members are singletons: `is` and `==` agree")
_RQ = "hpctrain/record/requeue_policy.py"
_ST = "hpctrain/health/stragglers.py"
_NL = "hpctrain/preflight/nccl_log.py"
_GD = "hpctrain/data/gpt_dataset.py"
_CU = "hpctrain/record/culprit.py"
_AE = "hpctrain/record/attempt_end.py"
_HG = "hpctrain/health/hang.py"
_CHUNK = "the size of the blocks a file is read in changes how it is read, not its checksum"
_BEAT5 = ("both monitors (the batch shell's and the ranks' watchdogs) are built with the one "
          "heartbeat period, 5 s: max(15, 3 * 5) is 15, and so is max(15, x) for 3 + 5, 3 - 5 "
          "and 3 / 5")
_CS = "hpctrain/record/checkpoint_store.py"
_NO_RANK = ("a candidate without a rank sorts after every rank among those of one time: any "
            "number above the largest rank count does that, 1 << 29 and 2 << 30 as well")
_EC = "hpctrain/exit_codes.py"
_ZERO_FIRST = ("0 is FINISHED's code, read from the table before this line: `< 0`, `<= 0` and "
               "`< 1` agree on every code that reaches it")
_RD = "hpctrain/scheduler/slurm/render.py"
_KINDS = ("a script's kind is `train` or `preflight` (hpctrain writes no other), and "
          "`preflight` sorts before `train`: `>=` holds for `train` alone")
_PM = "hpctrain/planner/memory.py"
_BW = "hpctrain/preflight/bandwidth.py"
_TM = "hpctrain/planner/timing.py"
_SG = "hpctrain/preflight/storage.py"
_ANCESTOR = ("a path and its ancestors: an ancestor's parts are a prefix of the path's, so it "
             "sorts before it, and `>` or `>=` holds exactly where `!=` or `==` does")
_TP = "hpctrain/preflight/topology.py"
_NIC_CELLS = ("RANK is read only for the cells between a GPU and an HCA, which nvidia-smi fills "
              "with PIX, PXB, PHB, NODE or SYS: X (a device with itself) and NV never")
_YES_NO = ("nvidia-smi prints these fields as Yes or No, or an unset value the parser makes None "
           "(read as \"\"): of yes, no and \"\" only yes sorts at or after yes")
EQUIVALENT: dict[tuple[str, str, str], str] = {
    (_TM, "core/ReplaceComparisonOperator_Eq_Lt", "return n // tp if n % tp == 0 else n / tp"):
        "`n % tp < 0` never holds, so n / tp always: the same number as n // tp where tp "
        "divides n, and what a non-divisible n took already",
    (_SG, "core/ReplaceComparisonOperator_GtE_Gt", "if len(parts) >= 3:"):
        "every line of /proc/mounts has six fields (device, mount point, type, options, dump, "
        "pass): `> 3` keeps the same lines as `>= 3`",
    (_SG, "core/ReplaceComparisonOperator_Eq_GtE",
     'note = "" if base == path else f" (not created yet; {base} is writable)"'): _ANCESTOR,
    (_SG, "core/ReplaceComparisonOperator_NotEq_Gt", "while not p.exists() and p != p.parent:"):
        _ANCESTOR,
    (_SG, "core/NumberReplacer", "ck_gb = checkpoint_bytes / 1e9 if checkpoint_bytes else None"):
        "GB of 1e9 ± 1 bytes: a relative change of 1e-9 against a free space measured in whole "
        "blocks, far below the one decimal printed",
    ("hpctrain/planner/layouts.py", "core/ReplaceComparisonOperator_Gt_NotEq",
     'for sp in ([False, True] if t > 1 and target.device != "cpu" else [False]):'):
        "a TP size is at least 1 (a divisor of the node size), so `t != 1` and `t > 1` agree",
    ("hpctrain/planner/save_memory.py", "core/ReplaceComparisonOperator_Eq_LtE",
     'if fmt == "dp_reshardable":'):
        "the formats are dp_reshardable, fully_reshardable and replicated: none sorts before "
        "dp_reshardable, so `<=` holds for it alone, as `==` does",
    ("hpctrain/planner/save_memory.py", "core/NumberReplacer",
     "bucket_size: int | None = None, runtime_buffers: int = 0) -> SaveMemory:"):
        "a default no caller uses: the planner (the only caller) always passes the target's "
        "runtime buffers",
    ("hpctrain/planner/save_time.py", "core/ReplaceComparisonOperator_Gt_NotEq",
     "not (gathered and dp > 1) or bool(dp_link_gbs),"):
        "the DP size is at least 1 (the layout refuses less), so `dp != 1` and `dp > 1` agree",
    ("hpctrain/planner/activations.py", "core/ReplaceBinaryOperator_FloorDiv_Div",
     "scores = b * a * s * s // tp"):
        "megatron-core requires the heads to divide over the TP ranks, so b·a·s²/t is a whole "
        "number, and far below 2**53, where a float holds it exactly: the same bytes",
    ("hpctrain/planner/activations.py", "core/ReplaceComparisonOperator_Eq_Lt", "if pp == 1:"):
        "with one stage there are no virtual stages (the layout refuses VPP without "
        "pipeline_model_parallel_size > 1), and min(pp - pp_rank, m) is then 1 as well",
    (_TM, "core/ReplaceBinaryOperator_Mod_FloorDiv", "return n // tp if n % tp == 0 else n / tp"):
        "n // tp and n / tp are the same number when tp divides n, and `n // tp == 0` takes the "
        "floor only when n < tp, a dimension smaller than the TP size, which megatron-core "
        "refuses",
    (_TM, "core/NumberReplacer", "if tp > 1 and hw.intra_node_busbw_gbs:"):
        "1 -> 0 (1 -> 2 is killed): with one TP rank the all-reduce, all-gather and "
        "reduce-scatter take 0 s (their own `n > 1`), so the stage adds nothing either way",
    (_TM, "core/NumberReplacer", "return nbytes * (n - 1) / n / (busbw_gbs * 1e9) if n > 1 else 0.0"):
        "else 0.0 -> ±1 (the mutants of `n > 1` are killed): every caller passes n > 1 (TP "
        "communication is priced for tp > 1, DP for dp > 1)",
    ("hpctrain/preflight/nccl_env.py", "core/ReplaceComparisonOperator_NotEq_IsNot",
     "chosen = [d for d in devices if any(spec.matches(d, n) for n, _ in spec.entries) != spec.exclude]"):
        "both sides are bools (any() and startswith()), and True and False are singletons",
    ("hpctrain/preflight/nccl_env.py", "core/NumberReplacer",
     "elif g not in GDR_LEVELS and not (g.isdigit() and 0 <= int(g) <= 5):"):
        "the lower bound 0 -> 1 or -1 (the mutants of 5 are killed): a string of digits is "
        "never negative, and `0` is answered by the branch before (GPUDirect RDMA off)",
    ("hpctrain/preflight/storage.py", "core/ReplaceComparisonOperator_Eq_GtE",
     'return params_estimate(job.model) * (12 if job.train.precision == "fp32" else 14)'):
        "train.precision is bf16, fp16 or fp32 (the job refuses any other), and only fp32 sorts "
        "at or after fp32",
    ("hpctrain/preflight/storage.py", "core/ReplaceComparisonOperator_Gt_NotEq",
     "if sizes and max(sizes) > 0:"):
        "the sizes are sums of file sizes, never negative: `!= 0` and `> 0` agree",
    (_TP, "core/ReplaceComparisonOperator_NotEq_Gt", 'if profile.node.device != "cuda":'):
        "the one caller (preflight.node.run_node_checks) reads the topology of a cuda profile "
        "only",
    (_TP, "core/ReplaceComparisonOperator_NotEq_Lt", 'if profile.node.device != "cuda":'):
        "node.device is cuda or cpu (the profile refuses any other), and only cpu sorts before "
        "cuda: `<` and `!=` agree",
    (_TP, "core/ReplaceBreakWithContinue", "if not _DEVICE.match(tok):\nbreak"):
        "the header's words after the devices are nvidia-smi's column titles (CPU Affinity, "
        "NUMA Affinity, GPU NUMA ID), none of which reads as a device: skipping them one by one "
        "collects the same devices",
    (_TP, "core/NumberReplacer",
     "if not parts or parts[0] not in devices or ln[:1].isspace():"):
        "`ln[:0]` (never a space) or `ln[:2]` (the header starts with eight): the only line that starts with a space and whose first word "
        "is a device is the header (the legend's words and the `NIC0:` lines are not devices), "
        "and the GPU0 row after it overwrites every cell it would set",
    (_TP, "core/NumberReplacer", '"X": 0,         # a device with itself'): _NIC_CELLS,
    (_TP, "core/NumberReplacer", '"NV": 1,        # NVLink'): _NIC_CELLS,
    (_TP, "core/NumberReplacer", '"PIX": 2,       # one PCIe switch'):
        "PIX at 1 or 3: it stays at or below PXB's 3, so a GPU whose nearest HCA is PIX passes "
        "as before (a tie with a PXB HCA passes too; 1 ties NV, never a GPU-to-NIC cell)",
    (_TP, "core/NumberReplacer", '"PXB": 3,       # several PCIe switches, not the host bridge'):
        "PXB 3 -> 2 (3 -> 4 is killed: an HCA behind the host bridge then passes): the threshold "
        "is PXB's own rank, so PIX and PXB still pass and PHB, NODE, SYS still warn",
    (_TP, "core/NumberReplacer", '"SYS": 6,       # across the CPUs\' interconnect'):
        "SYS 6 -> 7 (6 -> 5 is killed): SYS stays the farthest kind, below the 9 of a cell "
        "nvidia-smi's legend does not name",
    (_TP, "core/NumberReplacer",
     "want_nvlink = (profile.interconnect.intra_node_busbw_gbs or 0) > PCIE_BUSBW_CEILING_GBS"):
        "an unset intra-node bandwidth counts as 0: 1 or -1 is as far below the 60 GB/s PCIe "
        "ceiling",
    ("hpctrain/preflight/gpu.py", "core/ReplaceComparisonOperator_Eq_GtE",
     'or (r.get("remapped_rows.pending") or "").lower() == "yes"]'): _YES_NO,
    ("hpctrain/preflight/gpu.py", "core/ReplaceComparisonOperator_Eq_GtE",
     'pending = [r.get("index") for r in rows if (r.get("retired_pages.pending") or "").lower() == "yes"'):
        _YES_NO,
    ("hpctrain/preflight/gpu.py", "core/ReplaceComparisonOperator_NotEq_Lt",
     "if len(row) != len(header):"):
        "nvidia-smi's CSV quotes nothing and none of the queried fields' values holds a comma, "
        "so no row is longer than the header: a row that differs is shorter (an error line in "
        "place of a lost GPU's row, which `>` keeps and the story of a GPU lost during the query "
        "kills), and `<` skips it as `!=` does",
    (_BW, "core/NumberReplacer", "return size_bytes / seconds / 1e9"):
        "GB of 1e9 ± 1 bytes: a relative change of 1e-9, far below the two decimals a row prints "
        "and the resolution of any timed all-reduce",
    (_BW, "core/ReplaceBinaryOperator_Div_FloorDiv", "return size_bytes / seconds / 1e9"):
        "`size_bytes // seconds` (the first `/`; the second, GB/s floored to a whole number, is "
        "killed): bytes per second lose less than one byte, 1e-9 GB/s",
    ("hpctrain/preflight/infiniband.py", "core/ReplaceComparisonOperator_Eq_GtE",
     'if key == "state":'):
        "of the keys of ibstat's port section (State, Physical state, Rate, Base lid, LMC, SM "
        "lid, Capability mask, Port GUID, Link layer) only State sorts at or after `state`",
    (_PM, "core/ReplaceComparisonOperator_Eq_LtE",
     "rank == 0 and chunk.virtual_index == 0, bucket_size))"):
        "pipeline ranks (enumerate) and virtual indices are never negative: `<= 0` is `== 0` "
        "(`<`, `>=` are killed)",
    (_PM, "core/RemoveDecorator", "@lru_cache(maxsize=4096)"):
        "a cache of a pure function's results: only the planner's speed changes "
        "(tools/bench_cli)",
    (_RD, "core/ReplaceComparisonOperator_Eq_GtE",
     'spares = p.resilience.spare_nodes if inputs.kind == "train" else 0'): _KINDS,
    (_RD, "core/ReplaceComparisonOperator_Eq_GtE", 'if inputs.kind == "train":'): _KINDS,
    (_RD, "core/ReplaceComparisonOperator_Eq_GtE", '"gate": inputs.kind == "train" and p.preflight.gate,'):
        _KINDS,
    (_RD, "core/ReplaceComparisonOperator_Eq_LtE", '"gate": inputs.kind == "train" and p.preflight.gate,'):
        "the template reads `gate` only inside its `kind == \"train\"` branch",
    (_RD, "core/ReplaceTrueWithFalse",
     "undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,"):
        "the template ends with a block tag (`{% endif %}`) whose newline trim_blocks removes "
        "either way",
    (_RD, "core/ReplaceComparisonOperator_Eq_LtE", 'if s.gpu_directive == "gpus-per-node":'):
        "slurm.gpu_directive is one of gpus-per-node, gres and none (the profile refuses any "
        "other), and only gpus-per-node sorts at or before itself",
    (_RD, "core/NumberReplacer", "@functools.lru_cache(maxsize=1)"):
        "the size of the cache of the one template environment",
    ("hpctrain/flops.py", "core/ReplaceComparisonOperator_LtE_Eq",
     "if not peak_tflops_per_device or step_time_s <= 0 or world_size <= 0:"):
        "`world_size == 0` for `<= 0` (the mutants of `step_time_s <= 0` are killed): the callers "
        "pass a job's rank count, at least 1; `<= 0` only guards the division",
    ("hpctrain/flops.py", "core/NumberReplacer", "tp: int = 1) -> float:"):
        "the full-square count's default TP 1 -> 0 (1 -> 2 is killed): the vocabulary is padded "
        "to lcm(divisor, max(1, TP)), so 0 and 1 pad the same",
    ("hpctrain/preflight/bandwidth_rows.py", "core/ReplaceComparisonOperator_Eq_LtE",
     '"other jobs on it; exclude it" if level == FAIL else "")'):
        "a node's row is `fail` or `pass`, and only `fail` sorts at or before `fail`",
    ("hpctrain/data/order.py", "core/ReplaceBinaryOperator_BitOr_Add",
     "return (left << bits) | right"):
        "the low `bits` bits of `left << bits` are 0 and `right` is masked below 2**bits: `|` "
        "and `+` give the same number",
    (_EC, "core/ReplaceComparisonOperator_Lt_LtE", "if code > 128 or code < 0:"): _ZERO_FIRST,
    (_EC, "core/NumberReplacer", "if code > 128 or code < 0:"):
        "0 -> 1: " + _ZERO_FIRST + " (0 -> -1 and the mutants of 128 are killed)",
    (_GD, "core/NumberReplacer", "self.num_samples = (n - 1) // seq_length if n else 0"):
        "0 -> -1 for a split without tokens: -1 is refused as 0 is, with the same message "
        "(the mutants 0 -> 1 and 1 -> 0 or 2 are killed)",
    (_CS, "core/ReplaceTrueWithFalse", "qdir.mkdir(parents=True, exist_ok=True)"):
        "the folder set aside lies in root, so root exists and quarantine/ is made with or "
        "without its parents",
    (_CS, "core/ReplaceBinaryOperator_LShift_Mul", "CHUNK = 8 << 20"): _CHUNK,
    (_CS, "core/NumberReplacer", "CHUNK = 8 << 20"): _CHUNK,
    (_CS, "core/ReplaceComparisonOperator_NotEq_IsNot", "if rel != MANIFEST:"):
        "files are listed only in a save in progress (.partial-*), before its manifest is "
        "written there: no listed name is the manifest's",
    (_HG, "core/ReplaceComparisonOperator_Lt_NotEq",
     "elif steps and beat.step is not None and beat.step < max(steps):"):
        "this branch is reached only when no rank is silent, and then the blamed rank has the "
        "lowest step: its step differs from the largest exactly when it is smaller",
    (_HG, "core/ReplaceComparisonOperator_Lt_NotEq", "if seq < top and rank not in out:"):
        "top is the largest of the group's counts and seq one of them, so seq <= top: it "
        "differs from top exactly when it is smaller",
    (_HG, "core/NumberReplacer", "return (0 if quiet else 1, -silent[rank] if quiet else 0.0,"):
        "the blame key's first number puts silent ranks first whatever the constants moved by "
        "one, and a silent rank's second (minus its silence, below -15) sorts before 0, 1 or -1",
    (_AE, "core/ReplaceBinaryOperator_Mul_Div",
     "def finish_attempt(run: RunFolder, attempt: int, exit_code: int | None, *, scheduler: str,"):
        "`*` -> `/` in the signature: every caller passes run, attempt and exit code by "
        "position and the rest by name, which both signatures accept",
    (_CS, "core/AddNot", "if removed:"):
        "whether the folder's entry is flushed to disk after a prune: only a power loss right "
        "after it can tell, and then the pruned folders are merely back",
    (_HG, "core/ReplaceBinaryOperator_Mul_Add",
     "self.silent_after_s = silent_after_s if silent_after_s is not None else max(15.0, 3 * beat_s)"):
        _BEAT5,
    (_HG, "core/ReplaceBinaryOperator_Mul_Div",
     "self.silent_after_s = silent_after_s if silent_after_s is not None else max(15.0, 3 * beat_s)"):
        _BEAT5,
    (_HG, "core/ReplaceBinaryOperator_Mul_Sub",
     "self.silent_after_s = silent_after_s if silent_after_s is not None else max(15.0, 3 * beat_s)"):
        _BEAT5,
    (_HG, "core/NumberReplacer",
     "self.silent_after_s = silent_after_s if silent_after_s is not None else max(15.0, 3 * beat_s)"):
        "15 -> 14 (the mutants to 16, 2 and 4 are killed): " + _BEAT5,
    (_HG, "core/NumberReplacer",
     "write_atomic(verdict_path(attempt_dir), json.dumps(verdict.to_dict(), indent=1),"):
        "the indentation of the verdict file: any JSON reader reads 0, 1 or 2 the same",
    (_HG, "core/ReplaceOrWithAnd", "if not working or limit is None:"):
        "every heartbeat carries its rank's limit (runtime.watchdog.hang_limit always returns "
        "a number), so with ranks still working there is a limit: `and` and `or` agree",
    (_CU, "core/NumberReplacer", "c.rank if c.rank is not None else 1 << 30))"): _NO_RANK,
    (_CU, "core/ReplaceContinueWithBreak",
     "if not isinstance(f.time, (int, float)):\ncontinue"):
        "the one caller (attempt_end.first_failure) passes attempt_end.failures(), which keeps "
        "only the records with a time: the loop never meets one without",
    (_AE, "core/NumberReplacer",
     "yamlio.write_atomic(result_path(run, attempt), json.dumps(result.to_dict(), indent=1))"):
        "the indentation of result.json: any JSON reader reads 0, 1 or 2 the same",
    (_CS, "core/NumberReplacer",
     "FORMAT_VERSION = 2     # 2: CRC32C per file and per item (1: zlib CRC32 per file)"):
        "written into each manifest for later versions to read; no reader in this version "
        "checks it (they read the format name and the file list)",
    (_CU, "core/ReplaceTrueWithFalse", "@dataclass(frozen=True)"):
        "nothing assigns to a Culprit's fields: frozen only forbids what no code does",
    (_CU, "core/ReplaceOrWithAnd", 'killed.append(Culprit(rank, t.get("node") or node, at,'):
        "srun's task lines always name the node (the parser's pattern requires it), and a "
        "rank's heartbeat names its node as Slurm does (identity.node_name): `and` gives the "
        "heartbeat's node, which is the same",
    (_CU, "core/NumberReplacer",
     "seen = [last_beats[r][1] for r in ranks if last_beats[r][1] is not None]"):
        "the mutant that changes the filter's index ([0], the node) keeps every rank, as the "
        "filter does: every heartbeat has its time (Beat.beat_at); the other index's mutants "
        "are killed",
    (_RQ, "core/ReplaceComparisonOperator_Eq_Is", "if why == ExitReason.FINISHED:"): _ENUM,
    (_RQ, "core/ReplaceComparisonOperator_Eq_Is", "if why == ExitReason.CANCELLED:"): _ENUM,
    (_RQ, "core/ReplaceComparisonOperator_Eq_Is", "if why == ExitReason.UNSTABLE:"): _ENUM,
    (_RQ, "core/ReplaceComparisonOperator_NotEq_IsNot",
     "if why != ExitReason.PREFLIGHT_FAILED:"): _ENUM,
    (_RQ, "core/ReplaceComparisonOperator_Eq_LtE", "if why == ExitReason.CANCELLED:"):
        "'cancelled' sorts first of all exit reasons: `<=` holds for it alone",
    (_RQ, "core/ReplaceComparisonOperator_Eq_GtE", "if why == ExitReason.UNSTABLE:"):
        "'unstable' sorts last of all exit reasons: `>=` holds for it alone",
    (_RQ, "core/ReplaceComparisonOperator_GtE_Eq", "if used >= max_requeues:"):
        "requeues are counted up by one and checked before each, and a run's profile (its "
        "max_requeues) is fixed when it is submitted: the count reaches the budget before it "
        "could pass it",
    (_ST, "core/ReplaceComparisonOperator_Gt_NotEq",
     'f"ms per step, {self.intervals} interval{\'s\' if self.intervals > 1 else \'\'} in a "'):
        "a node is reported only when it was slow in this interval: its count is at least 1",
    (_ST, "core/ReplaceComparisonOperator_Gt_NotEq",
     'return (f"{self.node} (rank{\'s\' if len(self.ranks) > 1 else \'\'} {ranks}: {self.ratio:.2f}× "'):
        "a node is reported only for its slow ranks: it has at least one",
    (_ST, "core/ReplaceComparisonOperator_Gt_NotEq",
     "valid = [s for s in seconds if s is not None and s > 0]"):
        "compute times are measured durations, never negative: `!= 0` and `> 0` agree",
    (_NL, "core/ReplaceComparisonOperator_Gt_NotEq",
     'if ib and nodes > 1 and not via.get("NET/IB"):'):
        "a job has at least one node: `!= 1` and `> 1` agree",
    (_NL, "core/ReplaceComparisonOperator_NotEq_Lt", 'if profile.node.device != "cuda":'):
        "node.device is one of cuda and cpu (the profile refuses any other), and only cpu "
        "sorts before cuda: `<` and `!=` agree",
    (_NL, "core/ReplaceComparisonOperator_NotEq_Gt", 'if profile.node.device != "cuda":'):
        "the one caller (preflight.job._transport_rows) answers a cpu profile with its skip row "
        "before it reads any log, so a cuda profile is all this line sees",
    (_NL, "core/NumberReplacer",
     'for h in re.findall(r"\\]([^\\s:\\]]+):\\d+", m.group(1))})'):
        "the whole match adds only `NET/IB : Using ` and `; OOB` around group 1, and neither "
        "holds a `]name:port`: both find the same HCAs",
}


def signature_annotations(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (start, end) (row, column) spans of every function's argument and return
    annotations, and of its local variables' annotations, in ``source``."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            notes = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs,
                                            a.vararg, a.kwarg) if x is not None]
            # a local variable's annotation is never evaluated either (PEP 526)
            notes += [x.annotation for x in ast.walk(node) if isinstance(x, ast.AnnAssign)]
            for n in [*notes, node.returns]:
                if n is not None:
                    spans.append(((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)))
    return spans


def in_signature_annotation(source: str, pos: tuple[int, int]) -> bool:
    """Whether ``pos`` is in a signature's annotation of a module whose annotations are never
    evaluated (``from __future__ import annotations``)."""
    if "from __future__ import annotations" not in source:
        return False
    return any(start <= tuple(pos) < end for start, end in signature_annotations(source))


_FD = "hpctrain/file_door.py"
_DISJOINT = ("the open flags are single bits, each set once: `+` gives the number `|` does")
_REGULAR_BLOCKS = ("O_NONBLOCK has no effect on a regular file (Linux reads it whole either "
                   "way), and only a regular file reaches this line")
_CHUNKS = ("the size asked of one pread: any size of at least 1 reads the same bytes, in more "
           "or fewer calls")
_ONE_LINE = ("json's messages are one line of under 120 characters (the only longer one, "
             "an integer of over 4,300 digits, is cut at 120, which one character either way "
             "leaves within the line): the first line, cut there, is the message")
EQUIVALENT.update({
    **{(_FD, f"core/ReplaceBinaryOperator_BitOr_Add", line): _DISJOINT for line in (
        '_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC',
        'flags = _FLAGS if follow_links else _FLAGS | os.O_NOFOLLOW')},
    (_FD, "core/ReplaceTrueWithFalse", "os.set_blocking(fd, True)"): _REGULAR_BLOCKS,
    **{(_FD, op, "CHUNK = 1 << 20         # bytes asked of one pread"): _CHUNKS for op in (
        "core/ReplaceBinaryOperator_LShift_Add", "core/ReplaceBinaryOperator_LShift_Sub",
        "core/ReplaceBinaryOperator_LShift_Mul", "core/ReplaceBinaryOperator_LShift_Div",
        "core/ReplaceBinaryOperator_LShift_FloorDiv", "core/NumberReplacer")},
    (_FD, "core/ReplaceComparisonOperator_LtE_NotEq", "while total <= limit:"):
        "each read asks at most limit + 1 - total bytes, so total never passes limit + 1: "
        "`!=` stops the loop where `<=` does",
    (_FD, "core/ReplaceComparisonOperator_LtE_Lt", "while total <= limit:"):
        "total reaches exactly `limit` only by a short read, which on a regular file is its "
        "end: the next read `<=` makes gives nothing, so both stop with the same bytes",
    ("hpctrain/record/reader.py", "core/ReplaceComparisonOperator_NotEq_IsNot",
     'PATH = (Kind("a path (text, no NUL byte)", lambda v: _no_nul(v) and v != ""),)'):
        "CPython has one empty string object: every empty str is it, so `is not \"\"` and "
        "`!= \"\"` agree on text (and `_no_nul` has refused what is not text)",
    (_FD, "core/NumberReplacer",
     'raise Refused(f"is not JSON ({str(e).splitlines()[0][:120]})") from None'): _ONE_LINE,
})

_PS = "hpctrain/runtime/preemption.py"
_SI = "hpctrain/runtime/save_interval.py"
_GU = "hpctrain/runtime/guard.py"
_GUARD_TEST = ("if self.spike_factor > 0 and len(self.history) == self.spike_window and "
               "math.isfinite(loss):")
EQUIVALENT.update({
    (_SI, "core/ReplaceComparisonOperator_Eq_GtE",
     'if save.get("reason") == "periodic" and isinstance(save.get("stall_seconds"),'):
        "a save's reason is periodic, emergency, deadline or final: only periodic sorts at or "
        "after periodic",
    (_SI, "core/ReplaceComparisonOperator_Lt_NotEq",
     "if est.optimum_s is not None and est.interval_s < est.optimum_s:"):
        "an auto interval is Daly's optimum or the cap below it, never above: `!=` holds where "
        "`<` does",
    (_SI, "core/ReplaceComparisonOperator_Gt_GtE",
     "if not self.measured and est.interval_s > UNMEASURED_CAP_S:"):
        "at exactly the cap the estimate is replaced by one with the same interval and optimum",
    (_SI, "core/NumberReplacer", "for earlier in range(attempt - 1, 0, -1):"):
        "attempts count from 1: reading an attempt 0 finds no result, as stopping before it does",
    (_SI, "core/NumberReplacer", "self.nodes = max(1, nodes)"):
        "the node count is a ceiling of ranks over ranks per node, at least 1 already",
    (_SI, "core/NumberReplacer",
     "nodes = -(-ctx.world_size // max(1, ctx.env.local_world_size))"):
        "a rank runs among at least one rank of its node: a floor of 0 changes nothing (a "
        "floor of 2, one rank per node, is a story)",
    ("hpctrain/runtime/straggler_timing.py", "core/ReplaceComparisonOperator_Eq_LtE",
     "if node.intervals == window:"):
        "a node is named once slow for the window or more intervals: `<=` holds at the window "
        "alone, as `==` does",
    ("hpctrain/runtime/straggler_timing.py", "core/ReplaceComparisonOperator_Lt_LtE",
     "while time.thread_time() < end:"):
        "one more pass of the busy loop only at a clock reading exactly equal to the end",
    ("hpctrain/runtime/straggler_timing.py", "core/NumberReplacer",
     "per_step = self.timer.take() / max(1, self.steps)"):
        "a log step follows at least one step: a floor of 0 changes nothing (a floor of 2, an "
        "interval of one step, is a story)",
    **{("hpctrain/runtime/collectives.py", op, line):
       "a shortcut for one rank or none: a collective over one rank gives what the shortcut "
       "does, and no group has fewer"
       for op, line in (
           ("core/ReplaceComparisonOperator_Eq_Lt",
            "if not dist.is_initialized() or dist.get_world_size() == 1:"),
           ("core/NumberReplacer", "if not dist.is_initialized() or dist.get_world_size() == 1:"),
           ("core/ReplaceComparisonOperator_Gt_NotEq",
            "if dist.is_initialized() and dist.get_world_size() > 1:"),
           ("core/NumberReplacer", "if dist.is_initialized() and dist.get_world_size() > 1:"))},
    (_GU, "core/ReplaceComparisonOperator_Eq_GtE", _GUARD_TEST):
        "the history is a deque of at most the window's length: `>=` holds where `==` does",
    (_GU, "core/ReplaceComparisonOperator_Eq_Is", _GUARD_TEST):
        "the length and the window are small ints, which CPython keeps one object of each",
    (_GU, "core/ReplaceComparisonOperator_Gt_NotEq", _GUARD_TEST):
        "the job's loader refuses a negative spike factor: `!= 0` holds where `> 0` does",
    **{("hpctrain/record/attempt_records.py", "core/ReplaceTrueWithFalse", line):
       "every record is built with its fields named and none is assigned after it is made: "
       "keyword-only or frozen, each reads as it was made"
       for line in ("@dataclass(kw_only=True)", "@dataclass(frozen=True)")},
    ("hpctrain/record/attempt_records.py", "core/ReplaceOrWithAnd",
     "if value is None or isinstance(value, ExitReason):"):
        "the shortcut only: ExitReason(member) is the member, and ExitReason(None) raises the "
        "ValueError that gives None back",
    ("hpctrain/record/attempt_records.py", "core/ReplaceAndWithOr",
     "if record.decision is not None and not isinstance(record.decision, Decision):"):
        "with no decision, `or` calls Decision.from_dict(None), which gives None back",
    ("hpctrain/record/attempt_records.py", "core/ReplaceComparisonOperator_Eq_Is",
     'if f.name == "extra":'):
        "field names are identifiers, which CPython interns: the name is the literal's object",
    (_GU, "core/ReplaceTrueWithFalse", "@dataclass(frozen=True)"):
        "no code assigns to a Verdict's fields: frozen or not, each is read as it was made",
    (_PS, "core/ReplaceComparisonOperator_Eq_LtE",
     "if self.interval_steps and step % self.interval_steps == 0:"):
        "a remainder by a positive interval is never negative: `<= 0` holds where `== 0` does",
})

_RD = "hpctrain/runtime/checkpoint/items.py"
EQUIVALENT.update({
    (_RD, "core/ReplaceComparisonOperator_LtE_NotEq",
     "return start if start + nbytes <= archive.size else None"):
        "a zip archive ends with its central directory, after every record: a record's data "
        "never ends exactly at the archive's end, so `!=` holds where `<=` does (and a view "
        "cut before it fails zipfile first)",
    (_RD, "core/ReplaceBinaryOperator_Add_Sub",
     "self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]"):
        "zipfile reads an archive seeking from its start (0) and its end (2), never from the "
        "current position: the `whence=1` entry is never looked up (its `-` survives; the "
        "end's is killed)",
    (_RD, "core/NumberReplacer",
     "self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]"):
        "zipfile reads an archive seeking from its start (0) and its end (2), never from the "
        "current position: a key of the `whence=1` entry changed is never looked up (the "
        "others' are killed)",
    (_RD, "core/NumberReplacer", "n = max(0, min(len(b), self.size - self.pos))"):
        "only a read past the end differs: `max(1, ...)` then raises ValueError where 0 gives "
        "zipfile a short read and BadZipFile; record_start returns None for both",
})
_ST = "hpctrain/runtime/checkpoint/streaming.py"
_CUDA_ONLY = ("runs only where a target is on a GPU (the ring's CUDA copies, streaming_cuda): "
              "no test here has one; gpu_check's resume part runs it")
_TUNING = ("a size of the streaming ring, chosen for speed: any positive size streams the same "
           "bytes with the same checks (the tests set their own chunk sizes, 64 B to 1 MiB)")
_RING = "workers, BUFFERS_PER_THREAD, workers * BUFFERS_PER_THREAD * chunk, device))"
EQUIVALENT.update({(_ST, f"core/ReplaceBinaryOperator_Mul_{op}", _RING): _CUDA_ONLY
                   for op in ("Sub", "FloorDiv", "Add", "Pow", "Mod", "Div")})
EQUIVALENT.update({
    (_ST, "core/ReplaceComparisonOperator_Eq_Lt",
     "return target.device.index == torch.cuda.current_device()"): _CUDA_ONLY,
    (_ST, "core/ReplaceBinaryOperator_LShift_Mul", "CHUNK_BYTES = 16 << 20"): _TUNING,
    (_ST, "core/NumberReplacer", "CHUNK_BYTES = 16 << 20"): _TUNING,
    (_ST, "core/NumberReplacer", "BUFFERS_PER_THREAD = 2"): _TUNING + " (one buffer per "
        "worker too: a buffer is read into again only after the copy out of it is done)",
})
_RR = "hpctrain/runtime/checkpoint/reader.py"
EQUIVALENT.update({
    (_RR, "core/ReplaceOrWithAnd", "not streaming.streamable(target) or target.numel() == 0:"):
        "a target `_plain_target` returns is plain and contiguous: `streamable` refuses it only "
        "on a GPU other than the rank's (CUDA only), and an empty target streams its empty "
        "record as well",
    (_RR, "core/ReplaceOrWithAnd",
     "if target is None or target.dtype != dtype or tuple(target.shape) != shape or \\"):
        "the target is the request's, whose lengths are the stored chunk's shape (checked just "
        "before): `tuple(target.shape) != shape` never holds, and what the `and` then skips, "
        "`streamable`, refuses only a GPU target of another rank (CUDA only)",
    (_RR, "core/ReplaceComparisonOperator_Eq_Is",
     "if req.type == LoadItemType.BYTE_IO or expected is None or chunk is None or \\"):
        "LoadItemType's members are singletons: `is` is `==` for them",
    (_RR, "core/NumberReplacer", "DEFAULT_THREADS = 8"): "the number of reading threads, "
        "chosen for speed: any number reads the same bytes with the same checks (the tests "
        "give their own, 1 to 8)",
})
_TS = "hpctrain/tracking/sender.py"
EQUIVALENT.update({
    (_TS, "core/NumberReplacer", "self.committed = 0"):
        "the thread's first act, _backfill, sets committed to the attempt's resume step",
    (_TS, "core/ReplaceComparisonOperator_Eq_GtE", 'if kind == "record":'):
        "the kinds reaching this line are record, commit, file and close (report is taken "
        "before it): none sorts after record",
})
_WR = "hpctrain/runtime/checkpoint/writer.py"
EQUIVALENT.update({
    (_WR, "core/ReplaceComparisonOperator_NotEq_IsNot",
     "if offset != self._item_start or offset + length != self.position:"):
        "torch's _write_item records as the item's offset the int tell() returned, which is "
        "the object begin_item kept: `is not` is False where `!=` is",
    (_WR, "core/NumberReplacer",
     'record = {"files": sums, "write_seconds": round(time.monotonic() - started, 3)}'):
        "the digits the writer's duration is kept to in its record (2, 3 or 4 decimals)",
})

_IJ = "hpctrain/scheduler/slurm/in_job_restart.py"
_SC = "hpctrain/scheduler/slurm/commands.py"
_EV = "hpctrain/runtime/evaluation.py"
_RV = "hpctrain/view/runview.py"
_GH = "hpctrain/view/cost.py"
_CM = "hpctrain/runtime/checkpoint/manager.py"
_OC = "hpctrain/ops/control.py"
_REACHED = ("this line is reached only with a step reached of at least 1 (train.steps is at "
            "least 1), where 2 × reached is at or above reached + 1, reached − 1 and reached")
_CS = "hpctrain/runtime/checkpoint/state.py"
_MODEL_KEY = ("with one model chunk the section is `model` or `model0`: a name in memory only "
              "(the stored keys are the tensors' own), made by this one function for the save "
              "and the load alike; with two chunks `< 1` and `<= 1` keep `model0`, `model1`")
_FORMATS = ("the formats are dp_reshardable and fully_reshardable, and only the fully "
            "reshardable save calls the wrapped gather: `<=` adds dp_reshardable, which never "
            "calls it; `>=` keeps fully_reshardable alone")
_DETAIL = ("this line runs only for STOPPED or FINISHED, the constants `state` returns: `is` "
           "and `==` agree, and of the two only STOPPED is `>=` STOPPED")
EQUIVALENT.update({
    (_IJ, "core/ReplaceComparisonOperator_LtE_Eq", "if max_restarts <= 0:"):
        "resilience.max_in_job_restarts is at least 0 (the schema's bound): `== 0` holds "
        "where `<= 0` does",
    (_IJ, "core/ReplaceComparisonOperator_LtE_Eq", "if spare_nodes <= 0:"):
        "resilience.spare_nodes is at least 0 (the schema's bound): `== 0` holds where "
        "`<= 0` does",
    **{(_IJ, op, '"straggler node" if reason == ExitReason.STRAGGLER else "excluded")'):
       "the reasons that reach culprit_nodes are failed, killed, hung and straggler (plan "
       "takes no other, and _consider_restart stops before it), all ExitReason members, "
       "singletons: `is` agrees with `==`, and of the four only straggler sorts at or after "
       "straggler"
       for op in ("core/ReplaceComparisonOperator_Eq_Is",
                  "core/ReplaceComparisonOperator_Eq_GtE")},
    (_IJ, "core/ReplaceComparisonOperator_Eq_Is",
     'why.append("hung rank" if reason == ExitReason.HUNG else'):
        "ExitReason members are singletons: `is` agrees with `==`",
    (_IJ, "core/NumberReplacer",
     'return None, f"a {why.split(\':\')[0]} needs a spare node and the job has none"'):
        "the whys that reach this line (a hung rank, a straggler node, a node not responding) "
        "hold no colon: the first part is the last",
    (_IJ, "core/NumberReplacer", "sleep(1.0)"):
        "the period the old step is polled at: the wait's clock, not its sleeps, decides",
})

_WD = "hpctrain/runtime/watchdog.py"
EQUIVALENT.update({
    **{(_WD, op, 'floor = GPU_FLOOR_S if device == "cuda" else CPU_FLOOR_S'):
       "the device is `distributed.choose_device`'s literal \"cuda\" or \"cpu\" (one "
       "interned object each), and \"cpu\" sorts before \"cuda\": `is` and `>=` agree "
       "with `==`"
       for op in ("core/ReplaceComparisonOperator_Eq_Is",
                  "core/ReplaceComparisonOperator_Eq_GtE")},
    (_WD, "core/ReplaceAndWithOr", "if self.dump_stacks and self._stacks is not None:"):
        "start() opens the stacks file exactly when dump_stacks is set, and a verdict is acted "
        "on only after start(): the two halves are both true or both false",
})

EQUIVALENT.update({
    ("hpctrain/record/folder.py", "core/ReplaceComparisonOperator_Is_IsNot",
     "if profile is None and self.profile_file.is_file():"):
        "the one caller that passes a profile (the runtime's entry) passes the run's own "
        "resolved profile, which the run's file gives back",
})

_HW = "hpctrain/scheduler/slurm/hang_watch.py"
EQUIVALENT.update({
    (_HW, "core/ReplaceTrueWithFalse", line):
        "Python writes stderr through to the file at once (`write_through`, also when the "
        "batch shell sends it to a file): the message is there with or without the flush"
    for line in (
        'f"{verdict.decided_by})", file=sys.stderr, flush=True)',
        'print(f"[hpctrain] scancel --signal {sig} failed: {e}", file=sys.stderr, flush=True)',
        'f"killing the step", file=sys.stderr, flush=True)',
        'print(f"[hpctrain] killing the step failed: {e}", file=sys.stderr, flush=True)')})

_BS = "hpctrain/scheduler/slurm/batch_steps.py"
EQUIVALENT.update({
    (_BS, "core/NumberReplacer", "return infos[0][4][0]"):
        "getaddrinfo of one address gives one entry per socket type (stream, datagram, raw), "
        "each with that address: the second entry's is the first's",
    (_BS, "core/ReplaceFalseWithTrue",
     "overlap: bool = False        # an old step left to Slurm still counts its resources"):
        "the one place a Restart is made passes overlap",
    (_BS, "core/ReplaceComparisonOperator_Gt_NotEq",
     "return (run.resolved_profile().slurm.nodes, spares) if spares > 0 else (None, 0)"):
        "resilience.spare_nodes is at least 0 (the schema's bound): `!= 0` holds where `> 0` "
        "does",
    (_BS, "core/NumberReplacer", "return parse_slurm_time(rows[0].end_time) if rows else None"):
        "squeue asked for one job id answers one line: its last is its first",
    (_BS, "core/ReplaceComparisonOperator_LtE_Eq",
     "if effective_resilience(run.resolved_job(), run.resolved_profile()).spare_nodes <= 0:"):
        "resilience.spare_nodes is at least 0 (the schema's bound): `== 0` holds where `<= 0` "
        "does",
    (_BS, "core/ReplaceComparisonOperator_Is_Eq", "if restart and decision is restart.decision:"):
        "the restart's Decision says in_job=True, which the requeue policy's never does: the "
        "two are equal only when they are the same object",
    (_BS, "core/ReplaceComparisonOperator_Lt_NotEq", "if i + 1 < RELEASE_TRIES:"):
        "i + 1 runs from 1 to RELEASE_TRIES: `!=` holds where `<` does",
    (_BS, "core/ReplaceComparisonOperator_Eq_GtE", 'elif args.cmd == "watch":'):
        "the commands left at this line are watch and gate-failed, and gate-failed sorts "
        "before watch: `>=` holds where `==` does",
})

_BA = "hpctrain/runtime/batches.py"
EQUIVALENT.update({
    (_BA, "core/ReplaceComparisonOperator_Gt_NotEq",
     "self.tp_group = ps.get_tensor_model_parallel_group() if self.tp_size > 1 else None"):
        "a tensor-parallel size is at least 1: `!= 1` holds where `> 1` does",
    (_BA, "core/NumberReplacer",
     "self.tp_group = ps.get_tensor_model_parallel_group() if self.tp_size > 1 else None"):
        "`> 0` also broadcasts each microbatch within a TP group of one rank, which hands the "
        "rank its own rows (`> 2` is killed: TP2's second rank receives nothing)",
    (_BA, "core/ReplaceComparisonOperator_Gt_GtE",
     "self.tp_group = ps.get_tensor_model_parallel_group() if self.tp_size > 1 else None"):
        "`>= 1` also broadcasts each microbatch within a TP group of one rank, which hands the "
        "rank its own rows",
    **{(_BA, op, 'self.gpu = device == "cuda"'):
       "the device is `distributed.choose_device`'s literal \"cuda\" or \"cpu\" (one "
       "interned object each), and \"cpu\" sorts before \"cuda\": `is` and `>=` agree with "
       "`==`" for op in ("core/ReplaceComparisonOperator_Eq_GtE",
                         "core/ReplaceComparisonOperator_Eq_Is")},
    (_BA, "core/ReplaceComparisonOperator_Eq_LtE",
     "return tp_rank == 0 and (first_stage or last_stage)"):
        "a tensor-parallel rank is at least 0: `<= 0` holds where `== 0` does",
    (_BA, "core/ReplaceTrueWithFalse", "rows = rows.to(self.device, non_blocking=True)"):
        "non_blocking changes when the copy happens, not what arrives: the forward pass that "
        "reads the rows runs after it on the same stream",
    **{(_BA, op, 'loss = loss * float("nan")'): "NaN times, divided by, minus or plus any "
       "loss is NaN" for op in ("core/ReplaceBinaryOperator_Mul_Div",
                                "core/ReplaceBinaryOperator_Mul_Sub",
                                "core/ReplaceBinaryOperator_Mul_Add",
                                "core/ReplaceBinaryOperator_Mul_FloorDiv")},
    (_BA, "core/ReplaceComparisonOperator_Gt_NotEq",
     "return [it] * chunks if chunks > 1 else it"):
        "a rank has at least one model chunk: `!= 1` holds where `> 1` does",
})

_OS = "hpctrain/runtime/checkpoint/optimizer_step.py"
_OWN_CONSTANT = ("step_location returns this module's own constants (STATE, PARAM_GROUPS, "
                 "HYBRID), and `where` is its result: `is` agrees with `==`")
_LEAVES = ("the optimizers this line sees are leaves (_leaf_optimizers puts a hybrid's parts in "
           "its place): their step location is \"state\" or \"param_groups\", and only \"state\" "
           "sorts at or after \"state\"")
EQUIVALENT.update({
    (_OS, "core/ReplaceComparisonOperator_Eq_Is",
     "if inner is not None and step_location(inner) == HYBRID:"): _OWN_CONSTANT,
    (_OS, "core/ReplaceComparisonOperator_Eq_Is", "if step_location(sub) == STATE:"):
        _OWN_CONSTANT,
    (_OS, "core/ReplaceComparisonOperator_Eq_Is", "if where == PARAM_GROUPS:"): _OWN_CONSTANT,
    (_OS, "core/ReplaceComparisonOperator_NotEq_IsNot", "if step_location(inner) != STATE:"):
        _OWN_CONSTANT,
    (_OS, "core/ReplaceComparisonOperator_Eq_GtE",
     'if step_location(inner) == STATE for g in inner.param_groups if g["params"])'): _LEAVES,
    (_OS, "core/ReplaceComparisonOperator_NotEq_Lt", "if step_location(inner) != STATE:"):
        _LEAVES,
    (_OS, "core/ReplaceComparisonOperator_NotEq_Gt", "if step_location(inner) != STATE:"):
        "`>` never skips, so set_fused_adam(off) also looks at a FusedAdam's groups, which "
        "carry no fused flag: it changes nothing there",
    (_OS, "core/ReplaceComparisonOperator_Eq_GtE", "elif where == PARAM_GROUPS:"):
        "here the location is \"param_groups\" or \"hybrid\" (\"state\" was taken above), and "
        "only \"param_groups\" sorts at or after \"param_groups\"",
    (_OS, "core/ReplaceComparisonOperator_Eq_LtE",
     "subs = inner.sub_optimizers if step_location(inner) == HYBRID else [inner]"):
        "of \"hybrid\", \"param_groups\" and \"state\", only \"hybrid\" sorts at or before "
        "\"hybrid\"",
})

EQUIVALENT.update({
    ("hpctrain/data/blend.py", "core/ReplaceComparisonOperator_Lt_NotEq",
     "seqs = int(ds.document_indices[d]) if d < len(ds.document_indices) else len(ds)"):
        "d is a document number or the document count, and the document index has one entry "
        "more than there are documents: d never reaches its length, so `!=` holds where `<` "
        "does",
})

_RF = "hpctrain/record/files.py"
EQUIVALENT.update({
    (_RF, "core/ReplaceBinaryOperator_BitOr_Add",
     "flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | "
     "os.O_CLOEXEC"): _DISJOINT,
    (_RF, "core/ReplaceBinaryOperator_BitOr_Add",
     "fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW"):
        _DISJOINT,
    (_RF, "core/ReplaceTrueWithFalse", "os.set_blocking(fd, True)"): _REGULAR_BLOCKS,
    (_RF, "core/ReplaceBinaryOperator_Mul_Div",
     "def open_for_append(path: Path, *, truncate: bool = False) -> int:"):
        "`/` makes the path positional-only and truncate positional-or-keyword: every caller "
        "passes the path by position and truncate by name, which both signatures accept",
    (_EV, "core/NumberReplacer", "model=mo.model if chunks > 1 else mo.model[0],"):
        "`chunks > 0`: the list of one model chunk, which megatron-core's schedules without "
        "interleaving take as that chunk (they unwrap a one-element list)",
    (_EV, "core/ReplaceComparisonOperator_Lt_NotEq",
     "batch_s if i + 1 < self.iters else 0.0)"):
        "`i + 1` runs from 1 to `iters`: below `iters` is not equal to it",
    (_EV, "core/ReplaceComparisonOperator_Lt_NotEq",
     "if signal or (deadline and i + 1 < self.iters):"):
        "`i + 1` runs from 1 to `iters`: below `iters` is not equal to it",
    (_EV, "core/ReplaceComparisonOperator_Eq_GtE",
     "f\"{'a preemption signal' if stopped_by == 'signal' else 'the time limit'}\")"):
        "an evaluation without a loss was stopped by \"signal\" or \"deadline\", and "
        "\"deadline\" < \"signal\": `>=` is `==` here",
    (_EV, "core/ReplaceComparisonOperator_Eq_LtE", "if i == 0 and self.hooks is not None:"):
        "the batch index counts from 0: `i <= 0` is `i == 0`",
    (_RV, "core/ReplaceComparisonOperator_Eq_GtE",
     "return f\"{last.get('exit_reason')}: {reason}\" if self.state == STOPPED else \"\""): _DETAIL,
    (_RV, "core/ReplaceComparisonOperator_Eq_Is",
     "return f\"{last.get('exit_reason')}: {reason}\" if self.state == STOPPED else \"\""): _DETAIL,
    (_RV, "core/ReplaceAndWithOr", "if self.ledger and self.state in (STOPPED, FINISHED):"):
        "`state` is STOPPED or FINISHED only with a ledger, and with a ledger in any other "
        "state (CANCELLED, NOT SUBMITTED) the line below gives \"\" as the fall-through does",
    (_RV, "core/NumberReplacer", "view = build_views([run])[0]"):
        "`[0]` -> `[-1]`: one run, one view",
    (_SC, "core/ReplaceAndWithOr",
     'elif key == "State" and name is not None and name not in states:'):
        "every node's record in `scontrol show node` has one State=: a key before it that "
        "either `or` writes in its place is overwritten by it, and none after it is written",
    (_GH, "core/ReplaceComparisonOperator_Eq_GtE",
     'ids = [j["job_id"] for j in meta.get("jobs", []) if j.get("kind", "train") == "train"]'):
        _KINDS,
    (_GH, "core/NumberReplacer", 'int(meta_of[run.path].get("world_size") or 0))'):
        "`or 0` -> `or -1`: the ledger counts no attempt on ranks known nowhere, 0 or -1 alike",
    (_GH, "core/ReplaceTrueWithFalse", "@dataclass(frozen=True)"):
        "nothing assigns to a GpuHours: `frozen` only guards against it",
    (_SC, "core/NumberReplacer", "h, m, s = 0, nums[0], 0"):
        "`nums[0]` -> `nums[-1]`: this line reads a lone number, where the first is the last",
    (_RF, "core/NumberReplacer", "entry[1] -= 1"):
        "the reentrant depth is counted, but nothing reads it: the outermost block releases "
        "the lock in its own finally",
    (_CS, "core/ReplaceComparisonOperator_Eq_Lt",
     'return "model" if chunks == 1 else f"model{index}"'): _MODEL_KEY,
    (_CS, "core/ReplaceComparisonOperator_Eq_LtE",
     'return "model" if chunks == 1 else f"model{index}"'): _MODEL_KEY,
    (_CS, "core/ReplaceContinueWithBreak", 'if "param" not in world:\ncontinue'):
        "megatron-core's gathered state has one entry per buffer's dtype, and a buffer has one "
        "dtype: the loop runs once, with its `param` (the guard is for other shapes of that "
        "state), so `break` and `continue` end it alike",
    (_CS, "core/NumberReplacer", 'return "model" if chunks == 1 else f"model{index}"'):
        "`1` -> `0` (a surviving mutant of this line; `1` -> `2` gives two chunks one name, "
        "which the two-chunk story kills): " + _MODEL_KEY,
    (_CS, "core/ReplaceComparisonOperator_Eq_LtE",
     'if _is_distributed(o) and fmt == "fully_reshardable":'): _FORMATS,
    (_CS, "core/ReplaceComparisonOperator_Eq_GtE",
     'if _is_distributed(o) and fmt == "fully_reshardable":'): _FORMATS,
    (_CS, "core/ReplaceComparisonOperator_Eq_LtE",
     "if _is_distributed(o) and len(o.optimizer.state) == 0:"):
        "a length is never negative: `<= 0` is `== 0`",
    (_CS, "core/ReplaceComparisonOperator_Eq_GtE",
     "if _is_distributed(o) and len(o.optimizer.state) == 0:"):
        "the dummy state is only somewhere to load into: the load that follows fills every "
        "tensor of it, and Adam's count is set from hpctrain's own after",
    (_CS, "core/ReplaceOrWithAnd", 'if not state or kwargs.get("empty_data"):'):
        "hpctrain never asks for megatron-core's memory-efficient gather, so the state comes "
        "back on every rank (never empty), and the save never passes `empty_data`: neither "
        "side is ever true, with `or` or `and`",
    (_OC, "core/ReplaceComparisonOperator_Gt_NotEq",
     "extends = new_job is not None and new_job.train.steps > (view.step or 0)"):
        "the new job's train.steps is never below the step reached: an override of it at or "
        "below is refused just before, and any other override keeps the steps the run had, "
        "which it never passes",
    (_OC, "core/ReplaceBinaryOperator_Add_Sub",
     'f"than {reached} (e.g. --steps {max(2 * reached, reached + 1)})")'): _REACHED,
    (_OC, "core/ReplaceBinaryOperator_Add_FloorDiv",
     'f"than {reached} (e.g. --steps {max(2 * reached, reached + 1)})")'): _REACHED,
    (_OC, "core/ReplaceBinaryOperator_Add_Div",
     'f"than {reached} (e.g. --steps {max(2 * reached, reached + 1)})")'): _REACHED,
    (_OC, "core/NumberReplacer",
     "extends = new_job is not None and new_job.train.steps > (view.step or 0)"):
        "`view.step` is None only for a run that never trained, which has not finished, and "
        "`extends` changes something only for a finished run",
    (_OC, "core/NumberReplacer",
     "next_attempt: int = 1            # the first attempt the new job can start (to follow it)"):
        "`next_attempt` is read only for a resubmission, which always passes it: the default "
        "(an in-place requeue's) is never read",
    (_CM, "core/ReplaceTrueWithFalse",
     "progress=None, delay: float = 0.0, page_locked: bool = True):"):
        "the one caller (`_save`) passes `page_locked` by name every time: the default is "
        "never used",
    (_CM, "core/ReplaceComparisonOperator_NotEq_Gt", 'if manifest.get("kind", "full") != "full":'):
        "a manifest's kind is `full` or `weights` (a weights-only export), and `weights` sorts "
        "after `full`: `>` refuses exactly what `!=` does",
    (_CM, "core/ReplaceComparisonOperator_Eq_LtE",
     'if want_distopt and fmt == "dp_reshardable" and \\'):
        "the formats are dp_reshardable and fully_reshardable: only dp_reshardable sorts at or "
        "before dp_reshardable",
    (_CM, "core/NumberReplacer", 'self.read_stats["host_memory_wait_s"] = round(arena_wait, 3)'):
        "a load runs only at a resume, before the first step, and page-locking starts after "
        "the first step: the wait is the call's own microseconds, 0 at 2 or 4 decimals too",
})

_LP = "hpctrain/runtime/loop.py"
_FLAGS = ("each flag of the agreement is a sum over the ranks of 0.0 or 1.0: never negative, "
          "so `!= 0` and `> 0` agree")
_MULT = ("megatron-core's parameter groups always carry `lr_mult` and `wd_mult` (its "
         "`_get_param_groups` puts both in every group): the default is never read")
EQUIVALENT.update({
    (_LP, "core/ReplaceComparisonOperator_Eq_LtE", 'deadline = self.stopped_by == "deadline"'):
        "what stops an evaluation is `signal` or `deadline`, and `signal` sorts after "
        "`deadline`: only `deadline` is at or before it",
    (_LP, "core/ReplaceComparisonOperator_Eq_GtE", 'if kind == "validation":'):
        "the kinds evaluated are `validation` and `test`, and `test` sorts before "
        "`validation`: only `validation` is at or after it",
    (_LP, "core/NumberReplacer",
     'group["weight_decay"] = weight_decay * group.get("wd_mult", 1.0)'): _MULT,
    (_LP, "core/NumberReplacer", 'group["lr"] = lr * group.get("lr_mult", 1.0)'): _MULT,
    (_LP, "core/ReplaceComparisonOperator_Gt_NotEq",
     'else None, "stop": stop, "preempt": agreed[2] > 0, "deadline": agreed[3] > 0,'): _FLAGS,
    (_LP, "core/ReplaceComparisonOperator_Gt_NotEq", '"save_due": agreed[4] > 0}'): _FLAGS,
    (_LP, "core/ReplaceComparisonOperator_Eq_GtE", "ps.get_tensor_model_parallel_rank() == 0"):
        "a TP rank is never negative, so `>= 0` lets every TP rank of the last stage report; "
        "they all hold the same loss (the vocabulary-parallel cross entropy reduces over TP), "
        "so the mean over k copies of each replica's loss is the replicas' mean (with one "
        "replica bit for bit; with several, to the rounding of one float64 sum)",
})

_MW = "hpctrain/runtime/metrics.py"
_EPOCH = ("a record's `time` is the epoch second it was written, for people and plots; "
          "records are ordered and matched by step, so no reader depends on its digits past "
          "the second (3 is the millisecond, 2 or 4 equally true)")
EQUIVALENT.update({
    (_MW, "core/ReplaceComparisonOperator_Eq_GtE",
     "return step % self.interval == 0 or skipped is not None or step == self.total_steps"):
        "the loop never runs a step past `train.steps` (its `while self.step < "
        "self.total_steps`), so a step at or past the last is the last",
    (_MW, "core/ReplaceComparisonOperator_Eq_LtE",
     "return step % self.interval == 0 or skipped is not None or step == self.total_steps"):
        "the first `==`: a remainder by a positive interval is never negative, so `<= 0` is "
        "`== 0` (the last one's `<=` logs every step, which the stories kill)",
    (_MW, "core/NumberReplacer", '"attempt": self.ctx.attempt, "time": round(time.time(), 3)}'):
        _EPOCH,
    (_MW, "core/NumberReplacer", '"time": round(time.time(), 3)}'): _EPOCH,
})

_PR = "hpctrain/data/prepared.py"
_PR_ABS = ("the job's tokenizer reaching here is `byte` or an absolute path (made absolute "
           "against the job file), and every absolute path sorts before `byte` (`/` < `b`)")
_PR_INTERN = ("pathlib interns each component of a path it parses (`sys.intern`): two `.name`s "
              "that are equal are one object")
_PR_RACE = ("both paths were found to exist just before: samefile fails only if one is removed "
            "in between, and either answer then refuses or takes a file that is gone")
EQUIVALENT.update({
    (_PR, "core/ReplaceComparisonOperator_NotEq_Lt",
     'if recorded is None or not (sources or wanted != "byte"):'): _PR_ABS,
    (_PR, "core/ReplaceComparisonOperator_NotEq_LtE",
     'if recorded is None or not (sources or wanted != "byte"):'): _PR_ABS,
    (_PR, "core/ReplaceComparisonOperator_Eq_GtE",
     'if recorded == "byte" or wanted == "byte":'): _PR_ABS,
    (_PR, "core/ReplaceComparisonOperator_Eq_Is",
     '"""Equal, or the same file when both exist; when the recorded one is gone, the same '
     'name."""\nif recorded == wanted:'):
        "equal paths are the same file when it exists (samefile) and the same name when it is "
        "gone: the shortcut changes no answer",
    (_PR, "core/ReplaceTrueWithFalse", "if recorded == wanted:\nreturn True"):
        "equal paths: the same answer follows from the name or samefile below",
    (_PR, "core/ReplaceComparisonOperator_Eq_Is", "return recorded.name == wanted.name"):
        _PR_INTERN,
    (_PR, "core/ReplaceComparisonOperator_NotEq_IsNot", "if recorded.name != wanted.name:"):
        _PR_INTERN,
    (_PR, "core/ReplaceComparisonOperator_Eq_Is",
     "return Path(recorded).name == Path(wanted).name and \\"): _PR_INTERN,
    (_PR, "core/ReplaceComparisonOperator_NotEq_IsNot",
     "elif Path(r).name != Path(w).name:"): _PR_INTERN,
    (_PR, "core/ExceptionReplacer", "except (OSError, ValueError):"):
        _PR_RACE + "; a ValueError (a NUL byte) cannot come from paths the job's door took",
    (_PR, "core/ReplaceFalseWithTrue", "except (OSError, ValueError):\nreturn False"):
        _PR_RACE,
    (_PR, "core/ReplaceComparisonOperator_NotEq_IsNot", "if len(recorded) != len(wanted):"):
        "CPython keeps one object per small integer (a job names fewer than 257 sources)",
})

_FP = "hpctrain/data/fingerprint.py"
_FP_READ = "raw = file_door.read_fd(fd, FIXED - 1)"
_FP_BOUND = ("the read's bound: `read_fd` reads up to it plus one byte and the header parser "
             "takes the first FIXED; any bound from FIXED - 1 up reads the header whole")
_FP_NUMBER = "return type(v) in (int, float) and v == v and abs(v) != float(\"inf\")"
_FP_SPLIT = "return len(a) == len(b) and all(abs(x - y) <= CLOSE for x, y in zip(a, b))"
_FP_THREE = ("`data.split` is always read as three shares (`config.split.parse_split`), so "
             "both lists have three")
_FP_CLOSE = "two floats exactly CLOSE apart, the only difference, are not a real blend's"
_FP_ROUND = ("the shares are recorded to 12 digits and compared to CLOSE (1e-9): 11 or 13 "
             "digits compare the same")
_FP_SHOWN = "how much of a value a message shows before it is cut: the words are the same"
EQUIVALENT.update({
    (_FP, "core/ReplaceBinaryOperator_Sub_Add", _FP_READ): _FP_BOUND,
    (_FP, "core/ReplaceBinaryOperator_Sub_Mul", _FP_READ): _FP_BOUND,
    (_FP, "core/ReplaceBinaryOperator_Sub_FloorDiv", _FP_READ): _FP_BOUND,
    (_FP, "core/NumberReplacer", _FP_READ): _FP_BOUND + " (FIXED - 2 is killed)",
    (_FP, "core/ReplaceComparisonOperator_Eq_LtE", _FP_NUMBER):
        "`v <= v` is `v == v` for every number, NaN included (False either way)",
    (_FP, "core/ReplaceComparisonOperator_Eq_GtE", _FP_NUMBER):
        "`v >= v` is `v == v` for every number, NaN included (False either way)",
    (_FP, "core/ReplaceComparisonOperator_Eq_LtE", _FP_SPLIT): _FP_THREE,
    (_FP, "core/ReplaceComparisonOperator_Eq_GtE", _FP_SPLIT): _FP_THREE,
    (_FP, "core/ReplaceComparisonOperator_Eq_Is", _FP_SPLIT): _FP_THREE +
        " (and CPython keeps one object per small integer)",
    (_FP, "core/ReplaceComparisonOperator_LtE_Lt", _FP_SPLIT): _FP_CLOSE,
    (_FP, "core/ReplaceComparisonOperator_Gt_GtE",
     "if any(abs(a - b) > CLOSE for a, b in zip(ws, wn)):"): _FP_CLOSE,
    (_FP, "core/ReplaceComparisonOperator_NotEq_IsNot",
     "if (saved[key] is None) != (now[key] is None):"):
        "both sides are bools, of which Python has one object each",
    (_FP, "core/ReplaceComparisonOperator_Is_Eq",
     "return v is None or (type(v) is int and v >= 0)"):
        "`type(v) == int` is `type(v) is int` (one class object)",
    (_FP, "core/ReplaceComparisonOperator_Is_Eq", "return a is b"):
        "one side is None here: `None == x` holds exactly when `None is x`",
    (_FP, "core/NumberReplacer", "return v is None or (type(v) is int and v >= 0)"):
        "`>= 1`: a count the fingerprint records is of a corpus that holds samples, never 0 "
        "(`-1` is killed)",
    (_FP, "core/ReplaceComparisonOperator_GtE_Gt",
     "return v is None or (type(v) is int and v >= 0)"):
        "`> 0`: a count the fingerprint records is of a corpus that holds samples, never 0",
    (_FP, "core/ReplaceComparisonOperator_Is_Eq", 'and type(record.get("seed", 0)) is int'):
        "`type(x) == int` is `type(x) is int` (one class object)",
    (_FP, "core/ReplaceComparisonOperator_Is_Eq",
     'and type(record.get("seq_length", 1)) is int'):
        "`type(x) == int` is `type(x) is int` (one class object)",
    (_FP, "core/NumberReplacer", "FORMAT = 1"):
        "the format number is recorded for later readers; nothing compares it yet",
    (_FP, "core/NumberReplacer", '"weight": round(c.weight, 12)} for c in entries]'): _FP_ROUND,
    (_FP, "core/NumberReplacer",
     "split = None if data.split is None else [round(s, 12) for s in parse_split(data.split)]"):
        _FP_ROUND,
    (_FP, "core/NumberReplacer", 'and type(record.get("seed", 0)) is int'):
        "the default stands for a key a later format may leave out: any integer passes alike",
    (_FP, "core/NumberReplacer", 'and type(record.get("seq_length", 1)) is int'):
        "the default stands for a key a later format may leave out: any integer passes alike",
    (_FP, "core/NumberReplacer",
     "out.append((field, f\"{key.replace('_', ' ')} {show(str(saved[key]), 40)} -> \""):
        _FP_SHOWN,
    (_FP, "core/NumberReplacer", 'f"{show(str(now[key]), 40)}"))'): _FP_SHOWN,
    (_FP, "core/NumberReplacer",
     'raise ValueError(f"not a data fingerprint: {show(repr(saved), 60)}")'): _FP_SHOWN,
})

_SF = "hpctrain/submission/folders.py"
_SF_KEYWORDS = ("`*` -> `/` in the signature: every caller passes the first two arguments by "
                "position and the rest by name, which both signatures accept")
EQUIVALENT.update({
    (_SF, "core/ReplaceBinaryOperator_Mul_Div",
     'def prepare_run(resolved: Resolved, runs_root: Path, *, source: str = "",'): _SF_KEYWORDS,
    (_SF, "core/ReplaceBinaryOperator_Mul_Div",
     "def prepare_sweep(points: list[SweepPoint], runs_root: Path, *,"): _SF_KEYWORDS,
    **{(_SF, "core/ReplaceTrueWithFalse", line):
       "`create_run` made the run folder a moment before and makes no `logs` in it: the "
       "folder is new either way" for line in (
           "run.logs_dir.mkdir(parents=True, exist_ok=True)  # the batch script logs there",
           "run.logs_dir.mkdir(parents=True, exist_ok=True)")},
    (_SF, "core/NumberReplacer", "profile = points[0].resolved.profile"):
        "every point of a sweep is resolved on the one profile of the submission (a sweep "
        "varies job keys only), and there is at least one point: any point's profile is it",
})
EQUIVALENT[("hpctrain/runtime/assembly.py", "core/ReplaceComparisonOperator_Eq_GtE",
            'before = {n for r in ctx.run.ledger() if r.get("exit_reason") == "straggler"')] = (
    "the only attempts whose records name nodes left out are `exit_codes.EXCLUDING_REASONS` "
    "(preflight_failed, hung, straggler), and none of them sorts after `straggler`")


def equivalent_why(module: str, operator: str, line: str, in_annotation: bool = False,
                   before: str = "") -> str | None:
    """Why the mutant is equivalent, or None (``in_annotation``: the mutation is inside a
    function signature's annotation; ``before``: the line above, stripped, for the keys of
    lines that are not unique on their own, such as ``continue``: "line above\nline")."""
    if module in (_FD, _IJ, _SC, _OC) and operator == "core/ReplaceBinaryOperator_Mul_Div" and \
            line.startswith("def ") and \
            re.search(r"\(\s*[^*]*,\s*\*,", line) and line.count("*") == 1:
        return ("the `*` that makes the parameters after it keyword-only, made `/` (those before "
                "it positional-only): every caller passes those before it by position")
    if operator.startswith("core/ReplaceBinaryOperator_BitOr_") and (
            in_annotation or line.startswith("def ")):
        return ("a `|` in a signature's or a local variable's annotation: the modules use `from "
                "__future__ import annotations`, so annotations are never evaluated")
    return EQUIVALENT.get((module, operator, line)) or EQUIVALENT.get(
        (module, operator, f"{before}\n{line}"))


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                         check=True, capture_output=True).stdout.decode()
    return [f for f in out.split("\0") if f and (REPO / f).is_file()]


def copy_tree(dest: Path) -> None:
    """The working tree's files (tracked or not ignored) into ``dest``, replacing its copy."""
    if dest.exists():
        shutil.rmtree(dest)
    for name in tracked_files():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)


def config_text(module: str, tests: list[str], timeout: float) -> str:
    command = (f"{sys.executable} -m pytest -x -q -p no:cacheprovider --no-header "
               + " ".join(tests))
    return (f'[cosmic-ray]\nmodule-path = "{module}"\ntimeout = {timeout}\n'
            f'excluded-modules = []\ntest-command = "{command}"\n\n'
            '[cosmic-ray.distributor]\nname = "local"\n')


def cosmic_ray(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosmic_ray.cli", *args], cwd=cwd,
                          capture_output=True, text=True)


def skip_unrealistic(session: Path) -> int:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult
    skipped = 0
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):
            if any(SKIPPED_OPERATORS.match(m.operator_name) for m in item.mutations):
                db.set_result(item.job_id, WorkResult(output="operator left out",
                                                      worker_outcome=WorkerOutcome.SKIPPED))
                skipped += 1
    return skipped


NOT_SAMPLED = "not in the sample"


def keep_a_sample(session: Path, size: int, seed: int) -> int:
    """Leave all but ``size`` of the pending mutants untested, chosen uniformly at random with
    ``seed`` (the same seed, module and tests choose the same sample): the score is then an
    estimate for the module, from a sample the report names as such."""
    import random
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult
    with use_db(str(session), WorkDB.Mode.open) as db:
        # in the order of the mutations, not of their (random) job ids: the same sample again
        pending = sorted(db.pending_work_items, key=lambda item: [
            (str(m.module_path), m.operator_name, m.occurrence) for m in item.mutations])
        keep = set(random.Random(seed).sample(range(len(pending)), min(size, len(pending))))
        for i, item in enumerate(pending):
            if i not in keep:
                db.set_result(item.job_id, WorkResult(output=NOT_SAMPLED,
                                                      worker_outcome=WorkerOutcome.SKIPPED))
        return len(pending) - len(keep)


def results(session: Path, tree: Path, module: str) -> dict:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome
    source = (REPO / module).read_text()   # the tree's copy may hold a mutant now
    lines = source.splitlines()
    out = {"killed": 0, "survived": [], "equivalent": [], "incompetent": 0, "skipped": 0,
           "not_sampled": 0}
    with use_db(str(session), WorkDB.Mode.open) as db:
        out["pending"] = len(list(db.pending_work_items))
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                out["not_sampled" if result.output == NOT_SAMPLED else "skipped"] += 1
                continue
            (m,) = item.mutations
            line = lines[m.start_pos[0] - 1].strip()
            mutant = {"line": m.start_pos[0], "operator": m.operator_name,
                      "occurrence": m.occurrence, "source": line}
            before = lines[m.start_pos[0] - 2].strip() if m.start_pos[0] > 1 else ""
            why = equivalent_why(module, m.operator_name, line,
                                 in_signature_annotation(source, m.start_pos), before)
            if result.test_outcome == TestOutcome.SURVIVED:
                if why:
                    out["equivalent"].append({**mutant, "why": why})
                else:
                    out["survived"].append({**mutant, "diff": result.diff or ""})
            elif result.test_outcome == TestOutcome.INCOMPETENT:
                out["incompetent"] += 1
            else:
                out["killed"] += 1
    counted = out["killed"] + len(out["survived"])
    out["score"] = round(100.0 * out["killed"] / counted, 1) if counted else None
    return out


def run_module(key: str, tree: Path, work: Path, timeout: float,
               sample: int | None = None, seed: int = 0) -> dict:
    module, tests = MODULES[key]
    cfg, session = work / f"{key}.toml", work / f"{key}.sqlite"
    cfg.write_text(config_text(module, tests, timeout))
    session.unlink(missing_ok=True)
    started = time.monotonic()
    proc = cosmic_ray("init", str(cfg), str(session), cwd=tree)
    if proc.returncode:
        return {"error": "cosmic-ray init failed:\n" + proc.stderr[-2000:]}
    skip_unrealistic(session)
    if sample is not None:
        keep_a_sample(session, sample, seed)
    proc = cosmic_ray("baseline", str(cfg), cwd=tree)
    if proc.returncode:
        return {"error": "the tests fail on the unmutated code:\n" + (proc.stdout + proc.stderr)[-3000:]}
    proc = cosmic_ray("exec", str(cfg), str(session), cwd=tree)
    if proc.returncode:
        return {"error": "cosmic-ray exec failed:\n" + proc.stderr[-2000:]}
    return {"module": module, "tests": tests, "seconds": round(time.monotonic() - started),
            **results(session, tree, module)}


def report(key: str, r: dict) -> str:
    if "error" in r:
        return f"== {key}: ERROR\n{r['error']}\n"
    text = [f"== {key}: {r['module']} ({r['seconds']} s; tests: {' '.join(r['tests'])})",
            f"   killed {r['killed']}, survived {len(r['survived'])}, equivalent "
            f"{len(r['equivalent'])}, incompetent {r['incompetent']}, left out {r['skipped']}, "
            + (f"not in the sample {r['not_sampled']}, " if r.get("not_sampled") else "") +
            f"not yet tested {r.get('pending', 0)}"
            f" -> score {r['score']}%"
            + (" (an estimate, from a random sample)" if r.get("not_sampled") else "")]
    for s in r["survived"]:
        text.append(f"   SURVIVED line {s['line']} {s['operator']}#{s['occurrence']}: {s['source']}")
    for e in r["equivalent"]:
        text.append(f"   equivalent line {e['line']} {e['operator']}: {e['source']} -- {e['why']}")
    return "\n".join(text) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help=f"keys of {', '.join(MODULES)} (default: all)")
    ap.add_argument("--list", action="store_true", help="list the modules and their tests")
    ap.add_argument("--report", action="store_true",
                    help="only report on the sessions already in the work folder (also while "
                         "they run: the mutants tested so far)")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds one test run may take before the mutant counts as killed")
    ap.add_argument("--sample", type=int, metavar="N",
                    help="test N of each module's mutants, drawn at random (the score is then "
                         "an estimate; the report says so); default: all")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    args = ap.parse_args(argv)
    if args.list:
        for key, (module, tests) in MODULES.items():
            print(f"{key:16} {module:45} {' '.join(tests)}")
        return 0
    unknown = [k for k in args.modules if k not in MODULES]
    if unknown:
        print(f"Error: unknown module key(s) {', '.join(unknown)}; see --list", file=sys.stderr)
        return 2
    work = Path(os.environ.get("HPCTRAIN_MUTATION_DIR")
                or f"/tmp/hpctrain-mutation-{os.environ.get('USER', os.getuid())}")
    tree = work / "tree"
    if args.report:
        for key in args.modules or list(MODULES):
            session = work / f"{key}.sqlite"
            if session.exists():
                module, tests = MODULES[key]
                print(report(key, {"module": module, "tests": tests, "seconds": "-",
                                   **results(session, tree, module)}))
        return 0
    work.mkdir(parents=True, exist_ok=True)
    copy_tree(tree)
    where = subprocess.run([sys.executable, "-c", "import hpctrain; print(hpctrain.__file__)"],
                           cwd=tree, capture_output=True, text=True).stdout.strip()
    if not where.startswith(str(tree)):
        print(f"Error: the tests in {tree} would import hpctrain from {where or '?'}, not from "
              "the copy being mutated", file=sys.stderr)
        return 1
    all_results, failed = {}, False
    for key in args.modules or list(MODULES):
        r = run_module(key, tree, work, args.timeout, args.sample, args.seed)
        all_results[key] = r
        failed |= "error" in r
        print(report(key, r), flush=True)
        (work / "report.json").write_text(json.dumps(all_results, indent=1))
    print(f"report: {work / 'report.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
