"""The suite's two tiers. `make test` runs the quick one: every test not
named here, touching every module, command and stored reference in
minutes. `make test-all` (CI's) runs everything. A test is named here by
its cost alone, never to hide a failure: it took more than 4.5 s on two
cores in the suite's run of 2026-12-08 (AMD EPYC, cold compilation cache),
or it starts several processes or an emulator, or all its tests share a
fixture that costs (whole modules: `ALL`).
Kept in the quick tier though slower: each comparison with what timm,
transformers, big_vision or facebookresearch compute (their stored
outputs) and the objective of one's own (`test_user_objective`).

`conftest.py` marks these `full`; a name that matches no test of its
module fails the collection, so a renamed test cannot leave the list
unnoticed.
"""

ALL = "*"

# module -> its test functions of the full tier (all their parameters).
FULL = {
    "test_analysis": (
        "test_a_hybrids_grid_is_its_stems_grid",
        "test_analyze_writes_the_figures_and_numbers",
    ),
    "test_augreg": ("test_augreg_preset_trains_locally",),
    "test_benchmark": (
        "test_benchmark_reports_its_options_and_the_compiled_bytes",
        "test_profile_says_where_the_time_goes",
    ),
    "test_big_vision": (
        "test_a_flexivit_file_fine_tunes_at_another_size_sweeps_and_exports",
        "test_each_kind_fine_tunes_sweeps_predicts_and_exports",
    ),
    "test_block_options": (
        "test_all_four_scanned_and_rematerialised_compute_the_looped_model",
        "test_all_four_train_on_digits_and_resume",
        "test_fine_tuning_from_the_other_form_exits_2_with_one_line",
    ),
    "test_checkpoint": (
        "test_damaged_newest_checkpoints_resume_from_the_newest_intact_one",
        "test_killed_run_resumes_the_same_trajectory",
        "test_no_intact_checkpoint_is_a_one_line_error",
    ),
    "test_communication": (
        "test_batched_matmuls_written_as_convolutions_count_only_real_work",),
    "test_configs": ("test_recipe_runs_locally",),
    "test_container": ("test_the_images_files_run_its_entry_point",),
    "test_contrastive": (
        "test_clips_temperature_is_clamped_after_each_update_as_openclip_does",
    ),
    "test_cpu_sweep": ("test_dry_sweep_runs_each_kind_of_run_beside_timm",),
    "test_distill": (
        "test_a_teacher_split_by_fsdp_gives_the_replicated_step_and_stays_intact",
        "test_a_teacher_that_is_the_student_agrees_everywhere",
        "test_an_interrupted_distillation_resumes_exactly_and_keeps_its_teachers",
        "test_flexivit_distils_at_the_patch_size_of_each_step",
    ),
    "test_export_fields": ALL,
    "test_exports": (
        "test_a_trained_workdir_exports_for_both_from_the_command_line",),
    "test_fewshot": (
        "test_periodic_fewshot_during_training",
        "test_sharded_extraction_equals_single_device",
        "test_sweep_of_two_checkpoints_and_two_datasets",
    ),
    "test_finetune": ("test_finetuning_at_a_new_resolution",),
    "test_flexi": ("test_flexi_training_evaluates_at_each_size",),
    "test_fp8": (
        "test_fp8_follows_the_bf16_loss_and_multiplies_in_fp8",
        "test_fp8_state_is_checkpointed_and_a_resumed_run_ends_the_same",
        "test_fsdp_keeps_the_fp8_state_of_one_device",
    ),
    "test_global_order": (
        "test_a_damaged_shard_ends_the_command_with_one_line",
        "test_convert_data_rewrites_tfrecord_files_as_array_record",
    ),
    "test_gpu_check": (
        "test_dry_run_prints_ours_and_timms_rows_for_the_same_model",),
    "test_gpu_sweep": (
        "test_dry_sweep_runs_each_kind_of_candidate_into_one_table",),
    "test_image_text": (
        "test_clip_trains_over_eight_devices_and_evaluates_as_the_command_does",
        "test_lit_trains_the_text_tower_on_a_locked_digits_vit",
    ),
    "test_install": ALL,
    "test_launchers": (
        "test_train_runs_detached_on_every_worker_then_stop_saves_and_resumes",
    ),
    "test_layer_decay": (
        "test_vit_hybrid_masked_patch_and_mixer_keep_their_depths",),
    "test_length_schedule": (
        "test_steps_follow_the_schedule_resume_and_split_over_processes",
        "test_training_at_several_lengths_runs_on_digits",
    ),
    "test_mae": (
        "test_a_full_checkpoint_continues_pre_training",
        "test_decoder_sits_beside_the_vit_and_the_vit_alone_is_unchanged",
        "test_imagenet_pretraining_keeps_maes_table_for_fine_tuning",
        "test_mae_step_under_fsdp_tp_scan_and_remat_equals_one_device",
        "test_the_checkpoint_fine_tunes_and_sweeps_as_any_vit",
        "test_the_encoder_on_visible_patches_is_the_whole_encoder_masked",
    ),
    "test_masked_patch": (
        "test_a_model_run_at_another_patch_size_predicts_its_own_patches",
        "test_masked_patch_step_is_the_same_on_8_devices",
        "test_masked_patch_step_without_class_token_and_with_accumulation",
        "test_plan_compiles_the_masked_patch_step",
    ),
    "test_mixer_workflows": (
        "test_a_mixer_trains_with_fsdp_and_tensor_parallelism",
        "test_fine_tune_sweep_export_and_analyze",
    ),
    "test_models": ("test_fused_attention_paths_equal_the_explicit_one",),
    "test_multiprocess": ALL,
    "test_naflex_weights": (
        "test_a_naflex_model_exports_to_a_timm_directory_timm_loads",
        "test_predict_takes_a_non_square_image_at_its_aspect_ratio",
    ),
    "test_naflex_workflows": (
        "test_a_few_shot_sweep_at_a_chosen_sequence_length",
        "test_a_naflex_tower_fine_tunes_on_non_square_images",
    ),
    "test_old_workdirs": (
        "test_an_old_selfsup_run_resumes_with_a_fewshot_entry",
        "test_old_runs_are_swept",
    ),
    "test_optim": (
        "test_ema_over_several_steps_equals_a_hand_computed_average",
        "test_frozen_parameters_cost_no_backward_pass",
        "test_label_smoothing_loss_equals_independent_computation",
    ),
    "test_packing": ("test_packed_training_runs_on_digits",),
    "test_plan": (
        "test_a_v3_8_host_trains_with_the_plans_mesh_and_batch",
        "test_every_generation_plans_chips_cores_and_devices",
        "test_fsdp_blocks_gather_their_weights_again_for_the_backward_pass",
        "test_fsdp_over_slices_gathers_across_them_once",
        "test_plan_command_for_a_v3_host_twice_with_a_compilation_cache",
        "test_plan_command_writes_json",
        "test_plan_compiles_what_training_runs",
        "test_tpu_topology_plan_without_a_tpu",
        "test_two_slices_move_only_the_gradients_all_reduce_over_dcn",
    ),
    "test_predict": (
        "test_a_bad_image_is_named_and_skipped",
        "test_predictions_on_image_files_agree_with_the_evaluator",
    ),
    "test_rope": (
        "test_a_dinov3_file_fine_tunes_at_two_shapes_predicts_exports_and_sweeps",
        "test_a_rope_model_matches_a_float64_numpy_forward_at_two_shapes",
        "test_dinovs_draws_are_per_block_or_per_batch_as_the_form_says",
        "test_dinovs_draws_are_the_same_on_any_mesh",
        "test_dinovs_position_augmentations_apply_in_training_only",
        "test_sequences_equal_images_and_scanned_equals_looped",
    ),
    "test_search": ("test_a_search_ranks_what_fits_and_drops_what_does_not",),
    "test_selfsup": (
        "test_checkpoint_fine_tunes_with_the_masked_parts_dropped",
        "test_fewshot_of_the_checkpoint_and_of_random_init",
        "test_training_lowers_the_loss_and_evaluation_repeats",
    ),
    "test_sources": (
        "test_train_and_evaluate_on_an_image_folder",
        "test_unlabelled_image_folder_trains_self_supervised",
    ),
    "test_steps": (
        "test_fsdp_with_scanned_layers_equals_single_device",
        "test_gradient_accumulation_equals_the_big_batch",
        "test_gradient_accumulation_under_fsdp_equals_the_big_batch",
        "test_sharded_layouts_equal_single_device",
    ),
    "test_storage_faults": ALL,
    "test_torch_families": (
        "test_each_family_fine_tunes_sweeps_predicts_and_round_trips",),
    "test_train": ("test_a_diverged_state_is_never_saved",),
    "test_unreadable": (
        "test_a_run_on_a_folder_with_broken_images_trains_and_reports_them",
        "test_the_command_says_one_line_and_exits_at_once",
    ),
    "test_vtab": ("test_runner_fine_tunes_each_task_once",),
}
