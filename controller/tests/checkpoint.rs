//! Checkpoint discovery against fixtures of every convention (Megatron-LM legacy and
//! torch_dist, DeepSpeed, PyTorch DCP, Hugging Face Trainer) built in a temporary
//! directory: the newest half-written checkpoint is skipped, with the reason, and the one
//! before it chosen; trackers that name a missing directory, `release`, garbage; sharded
//! weights with a shard missing; detection; links out of the directory.

use std::fs;
use std::path::{Path, PathBuf};

use tempfile::TempDir;
use warden_controller::remedy::ResumePoint;
use warden_controller::remedy::checkpoint::{
    CheckpointError, Format, MAX_TRACKER_BYTES, detect, latest_complete, scan,
};

fn tmp() -> TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// Writes `bytes` at `root/rel`, making the directories above it.
fn put(root: &Path, rel: &str, bytes: &[u8]) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().expect("a file has a parent")).expect("mkdir -p");
    fs::write(&path, bytes).expect("write a fixture file");
}

fn mkdir(root: &Path, rel: &str) {
    fs::create_dir_all(root.join(rel)).expect("mkdir -p");
}

fn at(dir: &Path, name: &str, step: u64, format: &'static str) -> Option<ResumePoint> {
    Some(ResumePoint {
        path: dir.join(name),
        step,
        format,
    })
}

fn latest(dir: &Path) -> Option<ResumePoint> {
    latest_complete(dir, None).expect("the directory can be judged")
}

fn skipped(dir: &Path) -> Vec<String> {
    scan(dir, None)
        .expect("the directory can be scanned")
        .skipped()
}

/// A legacy Megatron checkpoint with the given tensor-parallel shards.
fn megatron_legacy(root: &Path, iteration: u64, shards: &[u32]) {
    for tp in shards {
        put(
            root,
            &format!("iter_{iteration:07}/mp_rank_{tp:02}/model_optim_rng.pt"),
            b"weights",
        );
    }
}

/// A Megatron torch_dist checkpoint.
fn megatron_dist(root: &Path, iteration: u64) {
    let dir = format!("iter_{iteration:07}");
    put(root, &format!("{dir}/.metadata"), b"meta");
    put(root, &format!("{dir}/common.pt"), b"common");
    put(root, &format!("{dir}/metadata.json"), b"{}");
    put(root, &format!("{dir}/__0_0.distcp"), b"data");
    put(root, &format!("{dir}/__1_0.distcp"), b"data");
}

fn tracker(root: &Path, text: &str) {
    put(root, "latest_checkpointed_iteration.txt", text.as_bytes());
}

#[test]
fn megatron_skips_a_save_the_tracker_does_not_name() {
    let dir = tmp();
    let root = dir.path();
    megatron_legacy(root, 100, &[0, 1, 2, 3]);
    megatron_legacy(root, 200, &[0, 2, 3]);
    tracker(root, "100\n");

    assert_eq!(latest(root), at(root, "iter_0000100", 100, "megatron"));
    assert_eq!(
        skipped(root),
        vec!["skipped iter_0000200: tracker names iter_0000100; shard mp_rank_01 missing"]
    );
    let scan = scan(root, None).expect("scan");
    assert_eq!(scan.format, Some(Format::Megatron));
    assert_eq!(scan.tracker.as_deref(), Some("iter_0000100"));
    assert!(scan.notes.is_empty(), "{:?}", scan.notes);
}

#[test]
fn megatron_falls_back_when_the_tracked_save_is_incomplete() {
    let dir = tmp();
    let root = dir.path();
    megatron_legacy(root, 100, &[0, 1]);
    megatron_legacy(root, 200, &[0, 1]);
    // A zero-length shard: the tracked save cannot be whole.
    put(root, "iter_0000200/mp_rank_01/model_optim_rng.pt", b"");
    megatron_legacy(root, 300, &[0, 1]);
    tracker(root, "200");

    assert_eq!(latest(root), at(root, "iter_0000100", 100, "megatron"));
    assert_eq!(
        skipped(root),
        vec![
            "skipped iter_0000300: tracker names iter_0000200",
            "skipped iter_0000200: mp_rank_01/model_optim_rng.pt is empty",
        ]
    );
}

#[test]
fn megatron_tracker_naming_a_missing_directory_falls_back() {
    let dir = tmp();
    let root = dir.path();
    megatron_legacy(root, 100, &[0]);
    megatron_legacy(root, 200, &[0]);
    tracker(root, "300");

    assert_eq!(latest(root), at(root, "iter_0000200", 200, "megatron"));
    let scan = scan(root, None).expect("scan");
    assert_eq!(
        scan.notes,
        vec!["tracker names iter_0000300, which is missing"]
    );
    assert!(scan.skipped().is_empty());
}

#[test]
fn megatron_release_tracker() {
    let dir = tmp();
    let root = dir.path();
    put(root, "release/mp_rank_00/model_optim_rng.pt", b"weights");
    megatron_legacy(root, 50, &[0]);
    tracker(root, "release\n");

    assert_eq!(latest(root), at(root, "release", 0, "megatron"));
    assert_eq!(
        skipped(root),
        vec!["skipped iter_0000050: tracker names release"]
    );
}

#[test]
fn megatron_torch_dist_without_metadata_is_skipped() {
    let dir = tmp();
    let root = dir.path();
    megatron_dist(root, 100);
    megatron_dist(root, 200);
    fs::remove_file(root.join("iter_0000200/.metadata")).expect("rm");
    tracker(root, "200");

    assert_eq!(latest(root), at(root, "iter_0000100", 100, "megatron"));
    assert_eq!(
        skipped(root),
        vec!["skipped iter_0000200: .metadata missing (written last: the save did not finish)"]
    );
}

#[test]
fn megatron_pipeline_shards_with_a_gap() {
    let dir = tmp();
    let root = dir.path();
    for (tp, pp) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        put(
            root,
            &format!("iter_0000100/mp_rank_{tp:02}_{pp:03}/model_optim_rng.pt"),
            b"w",
        );
    }
    for (tp, pp) in [(0, 0), (0, 1), (1, 1)] {
        put(
            root,
            &format!("iter_0000200/mp_rank_{tp:02}_{pp:03}/model_optim_rng.pt"),
            b"w",
        );
    }
    tracker(root, "200");

    assert_eq!(latest(root), at(root, "iter_0000100", 100, "megatron"));
    assert_eq!(
        skipped(root),
        vec!["skipped iter_0000200: shard mp_rank_01_000 missing"]
    );
}

#[test]
fn megatron_without_a_tracker_has_nothing_complete() {
    let dir = tmp();
    let root = dir.path();
    megatron_legacy(root, 100, &[0]);

    assert_eq!(detect(root).expect("detect"), Some(Format::Megatron));
    assert_eq!(latest(root), None);
    assert_eq!(
        skipped(root),
        vec![
            "skipped iter_0000100: no latest_checkpointed_iteration.txt (Megatron writes it once a save completes)"
        ]
    );
}

#[test]
fn garbage_trackers_are_errors_naming_the_file() {
    for garbage in ["abc\n", "", "  \n", "-5", "12 13", "100\u{0}"] {
        let dir = tmp();
        let root = dir.path();
        megatron_legacy(root, 100, &[0]);
        tracker(root, garbage);
        match latest_complete(root, None) {
            Err(CheckpointError::Tracker { path, .. }) => {
                assert_eq!(path, root.join("latest_checkpointed_iteration.txt"));
            }
            other => panic!("tracker {garbage:?}: {other:?}"),
        }
    }

    let dir = tmp();
    let root = dir.path();
    megatron_legacy(root, 100, &[0]);
    let huge = "1".repeat(usize::try_from(MAX_TRACKER_BYTES).expect("small") + 1);
    tracker(root, &huge);
    let err = latest_complete(root, None).expect_err("a tracker too large to read");
    assert!(
        err.to_string().contains("is larger than 4096 bytes"),
        "{err}"
    );

    let dir = tmp();
    let root = dir.path();
    put(root, "global_step100/mp_rank_00_model_states.pt", b"w");
    put(root, "latest", b"../../etc");
    match latest_complete(root, None) {
        Err(CheckpointError::Tracker { path, what }) => {
            assert_eq!(path, root.join("latest"));
            assert_eq!(what, "holds \"../../etc\", not a checkpoint tag");
        }
        other => panic!("{other:?}"),
    }
}

/// A DeepSpeed ZeRO checkpoint: model states per model-parallel rank, optimizer states
/// per data-parallel rank.
fn deepspeed(root: &Path, tag: &str, mp: &[u32], dp: &[u32]) {
    for m in mp {
        put(root, &format!("{tag}/mp_rank_{m:02}_model_states.pt"), b"w");
        for d in dp {
            put(
                root,
                &format!("{tag}/bf16_zero_pp_rank_{d}_mp_rank_{m:02}_optim_states.pt"),
                b"o",
            );
        }
    }
}

#[test]
fn deepspeed_skips_a_save_in_progress() {
    let dir = tmp();
    let root = dir.path();
    deepspeed(root, "global_step100", &[0], &[0, 1, 2, 3]);
    deepspeed(root, "global_step200", &[0], &[0, 2, 3]);
    put(root, "latest", b"global_step100");
    put(root, "zero_to_fp32.py", b"# script");

    assert_eq!(latest(root), at(root, "global_step100", 100, "deepspeed"));
    assert_eq!(
        skipped(root),
        vec![
            "skipped global_step200: tracker names global_step100; optimizer shard zero_pp_rank_1_mp_rank_00 missing"
        ]
    );
}

#[test]
fn deepspeed_falls_back_from_a_broken_tracked_save() {
    let dir = tmp();
    let root = dir.path();
    deepspeed(root, "global_step100", &[0, 1], &[0, 1]);
    deepspeed(root, "global_step200", &[0, 1], &[0, 1]);
    fs::remove_file(root.join("global_step200/mp_rank_01_model_states.pt")).expect("rm");
    put(
        root,
        "global_step200/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
        b"",
    );
    put(root, "latest", b"global_step200\n");

    assert_eq!(latest(root), at(root, "global_step100", 100, "deepspeed"));
    assert_eq!(
        skipped(root),
        vec![
            "skipped global_step200: mp_rank_01_model_states.pt missing; \
             bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt is empty"
        ]
    );
}

#[test]
fn deepspeed_zero3_model_states_per_data_parallel_rank() {
    let dir = tmp();
    let root = dir.path();
    for (tag, dps) in [("global_step100", [0, 1]), ("global_step200", [0, 0])] {
        for d in dps {
            put(
                root,
                &format!("{tag}/zero_pp_rank_{d}_mp_rank_00_model_states.pt"),
                b"w",
            );
        }
        for d in [0, 1] {
            put(
                root,
                &format!("{tag}/bf16_zero_pp_rank_{d}_mp_rank_00_optim_states.pt"),
                b"o",
            );
        }
    }
    put(root, "latest", b"global_step200");

    assert_eq!(latest(root), at(root, "global_step100", 100, "deepspeed"));
    assert_eq!(
        skipped(root),
        vec!["skipped global_step200: zero_pp_rank_1_mp_rank_00_model_states.pt missing"]
    );
}

#[test]
fn deepspeed_tracker_naming_a_missing_tag() {
    let dir = tmp();
    let root = dir.path();
    deepspeed(root, "global_step100", &[0], &[]);
    put(root, "latest", b"global_step300");

    assert_eq!(latest(root), at(root, "global_step100", 100, "deepspeed"));
    let scan = scan(root, None).expect("scan");
    assert_eq!(scan.tracker.as_deref(), Some("global_step300"));
    assert_eq!(
        scan.notes,
        vec!["tracker names global_step300, which is missing"]
    );
}

/// A DCP checkpoint of two ranks.
fn dcp(root: &Path, name: &str) {
    put(root, &format!("{name}/__0_0.distcp"), b"data");
    put(root, &format!("{name}/__1_0.distcp"), b"data");
    put(root, &format!("{name}/.metadata"), b"meta");
}

#[test]
fn dcp_skips_saves_without_their_metadata() {
    let dir = tmp();
    let root = dir.path();
    dcp(root, "step_100");
    dcp(root, "step_200");
    fs::remove_file(root.join("step_200/.metadata")).expect("rm");
    dcp(root, "step_300");
    put(root, "step_300/.metadata", b"");
    dcp(root, "step_400");
    put(root, "step_400/__1_0.distcp", b"");
    put(root, "step_500/.metadata", b"meta");
    mkdir(root, "logs");
    mkdir(root, "run2");

    assert_eq!(latest(root), at(root, "step_100", 100, "dcp"));
    assert_eq!(
        skipped(root),
        vec![
            "skipped step_500: no .distcp data files",
            "skipped step_400: __1_0.distcp is empty",
            "skipped step_300: .metadata is empty",
            "skipped step_200: .metadata missing (written last: the save did not finish)",
        ]
    );
}

#[test]
fn dcp_step_names() {
    let dir = tmp();
    let root = dir.path();
    dcp(root, "step-100");
    dcp(root, "iter_150");
    dcp(root, "checkpoint_120");
    dcp(root, "ckpt90");
    assert_eq!(detect(root).expect("detect"), Some(Format::Dcp));
    assert_eq!(latest(root), at(root, "iter_150", 150, "dcp"));
    let steps: Vec<Option<u64>> = scan(root, None)
        .expect("scan")
        .candidates
        .iter()
        .map(|c| c.step)
        .collect();
    assert_eq!(steps, vec![Some(150), Some(120), Some(100), Some(90)]);
}

fn trainer_state(step: u64) -> Vec<u8> {
    format!(r#"{{"global_step": {step}, "epoch": 1.5, "log_history": [{{"loss": 1.0}}]}}"#)
        .into_bytes()
}

#[test]
fn hugging_face_skips_a_checkpoint_without_its_state() {
    let dir = tmp();
    let root = dir.path();
    put(root, "checkpoint-100/model.safetensors", b"w");
    put(root, "checkpoint-100/optimizer.pt", b"o");
    put(
        root,
        "checkpoint-100/trainer_state.json",
        &trainer_state(100),
    );
    put(root, "checkpoint-200/pytorch_model.bin", b"w");
    put(
        root,
        "checkpoint-200/trainer_state.json",
        &trainer_state(200),
    );
    put(root, "checkpoint-300/model.safetensors", b"w");
    put(root, "checkpoint-300/optimizer.pt", b"");
    put(
        root,
        "checkpoint-300/trainer_state.json",
        &trainer_state(300),
    );
    put(
        root,
        "checkpoint-400/trainer_state.json",
        &trainer_state(400),
    );
    put(root, "checkpoint-500/model.safetensors", b"w");
    put(root, "checkpoint-600/model.safetensors", b"w");
    put(
        root,
        "checkpoint-600/trainer_state.json",
        br#"{"global_step": 6"#,
    );
    put(root, "runs/events.out", b"tb");

    assert_eq!(latest(root), at(root, "checkpoint-200", 200, "huggingface"));
    let skipped = skipped(root);
    assert_eq!(skipped.len(), 4, "{skipped:?}");
    assert!(
        skipped[0].starts_with("skipped checkpoint-600: trainer_state.json is not valid: "),
        "{skipped:?}"
    );
    assert_eq!(
        skipped[1..],
        [
            "skipped checkpoint-500: trainer_state.json missing (written last: the save did not finish)",
            "skipped checkpoint-400: no model weights (model.safetensors, pytorch_model.bin or a sharded index)",
            "skipped checkpoint-300: optimizer.pt is empty",
        ]
    );
}

#[test]
fn hugging_face_step_is_the_trainer_state_global_step() {
    let dir = tmp();
    let root = dir.path();
    put(root, "checkpoint-100/model.safetensors", b"w");
    put(
        root,
        "checkpoint-100/trainer_state.json",
        &trainer_state(120),
    );
    assert_eq!(latest(root), at(root, "checkpoint-100", 120, "huggingface"));
}

/// A Trainer checkpoint with weights in `n` safetensors shards and their index.
fn hf_sharded(root: &Path, step: u64, n: u32) {
    let name = format!("checkpoint-{step}");
    let mut map = Vec::new();
    for i in 1..=n {
        let shard = format!("model-{i:05}-of-{n:05}.safetensors");
        put(root, &format!("{name}/{shard}"), b"w");
        map.push(format!(r#""layer.{i}.weight": "{shard}""#));
    }
    let index = format!(
        r#"{{"metadata": {{"total_size": 8}}, "weight_map": {{{}}}}}"#,
        map.join(", ")
    );
    put(
        root,
        &format!("{name}/model.safetensors.index.json"),
        index.as_bytes(),
    );
    put(
        root,
        &format!("{name}/trainer_state.json"),
        &trainer_state(step),
    );
}

#[test]
fn hugging_face_sharded_index_with_a_missing_shard() {
    let dir = tmp();
    let root = dir.path();
    hf_sharded(root, 100, 3);
    hf_sharded(root, 200, 3);
    fs::remove_file(root.join("checkpoint-200/model-00002-of-00003.safetensors")).expect("rm");

    assert_eq!(latest(root), at(root, "checkpoint-100", 100, "huggingface"));
    assert_eq!(
        skipped(root),
        vec![
            "skipped checkpoint-200: shard model-00002-of-00003.safetensors missing \
             (model.safetensors.index.json)"
        ]
    );
}

#[test]
fn hugging_face_index_naming_a_file_outside_is_incomplete() {
    let dir = tmp();
    let root = dir.path();
    put(
        root,
        "checkpoint-100/trainer_state.json",
        &trainer_state(100),
    );
    put(
        root,
        "checkpoint-100/pytorch_model.bin.index.json",
        br#"{"weight_map": {"w": "../../outside.bin"}}"#,
    );
    put(root, "outside.bin", b"w");

    assert_eq!(latest(root), None);
    assert_eq!(
        skipped(root),
        vec![
            "skipped checkpoint-100: pytorch_model.bin.index.json names \"../../outside.bin\", \
             not a file of the checkpoint"
        ]
    );
}

#[test]
fn hugging_face_with_nested_deepspeed_and_fsdp_states() {
    let dir = tmp();
    let root = dir.path();
    put(
        root,
        "checkpoint-100/trainer_state.json",
        &trainer_state(100),
    );
    put(root, "checkpoint-100/latest", b"global_step100");
    deepspeed(
        &root.join("checkpoint-100"),
        "global_step100",
        &[0],
        &[0, 1],
    );
    put(
        root,
        "checkpoint-200/trainer_state.json",
        &trainer_state(200),
    );
    put(
        root,
        "checkpoint-200/pytorch_model_fsdp_0/__0_0.distcp",
        b"d",
    );
    put(root, "checkpoint-200/pytorch_model_fsdp_0/.metadata", b"m");
    put(
        root,
        "checkpoint-300/trainer_state.json",
        &trainer_state(300),
    );
    put(
        root,
        "checkpoint-300/pytorch_model_fsdp_0/__0_0.distcp",
        b"d",
    );

    assert_eq!(latest(root), at(root, "checkpoint-200", 200, "huggingface"));
    assert_eq!(
        skipped(root),
        vec![
            "skipped checkpoint-300: pytorch_model_fsdp_0/.metadata missing \
             (written last: the save did not finish)"
        ]
    );
    fs::remove_dir_all(root.join("checkpoint-300")).expect("rm");
    fs::remove_dir_all(root.join("checkpoint-200")).expect("rm");
    assert_eq!(latest(root), at(root, "checkpoint-100", 100, "huggingface"));
}

/// A fixture: what it is, how to build it, the convention it follows.
type Layout = (&'static str, fn(&Path), Format);

#[test]
fn detection_of_each_convention() {
    let cases: [Layout; 6] = [
        (
            "megatron",
            |r| {
                megatron_legacy(r, 1, &[0]);
                tracker(r, "1");
            },
            Format::Megatron,
        ),
        (
            "megatron torch_dist without tracker",
            |r| megatron_dist(r, 1),
            Format::Megatron,
        ),
        (
            "deepspeed",
            |r| {
                deepspeed(r, "global_step1", &[0], &[0]);
                put(r, "latest", b"global_step1");
            },
            Format::DeepSpeed,
        ),
        (
            "deepspeed without tracker",
            |r| deepspeed(r, "global_step1", &[0], &[]),
            Format::DeepSpeed,
        ),
        ("dcp named like megatron", |r| dcp(r, "iter_1"), Format::Dcp),
        (
            "huggingface",
            |r| put(r, "checkpoint-1/trainer_state.json", &trainer_state(1)),
            Format::HuggingFace,
        ),
    ];
    for (what, build, format) in cases {
        let dir = tmp();
        build(dir.path());
        assert_eq!(detect(dir.path()).expect("detect"), Some(format), "{what}");
        assert_eq!(
            scan(dir.path(), None).expect("scan").format,
            Some(format),
            "{what}"
        );
    }
}

#[test]
fn a_forced_format_is_used_as_given() {
    let dir = tmp();
    let root = dir.path();
    dcp(root, "step_100");
    assert_eq!(
        latest_complete(root, Some(Format::HuggingFace)).expect("judged"),
        None
    );
    assert_eq!(
        latest_complete(root, Some(Format::Dcp)).expect("judged"),
        at(root, "step_100", 100, "dcp")
    );
}

#[test]
fn empty_and_unrecognised_directories_have_no_checkpoint() {
    let dir = tmp();
    let root = dir.path();
    assert_eq!(detect(root).expect("detect"), None);
    assert_eq!(latest(root), None);

    put(root, "runs/events.out.tfevents", b"tb");
    put(root, "config.json", b"{}");
    mkdir(root, "step_1");
    let scan = scan(root, None).expect("scan");
    assert_eq!(scan.format, None);
    assert!(scan.candidates.is_empty());
    assert_eq!(scan.latest(), None);
}

#[test]
fn unreadable_or_missing_directories_are_errors_naming_the_path() {
    let dir = tmp();
    let missing: PathBuf = dir.path().join("nope");
    match latest_complete(&missing, None) {
        Err(CheckpointError::Read { path, .. }) => assert_eq!(path, missing),
        other => panic!("{other:?}"),
    }
    put(dir.path(), "file", b"x");
    let file = dir.path().join("file");
    match latest_complete(&file, Some(Format::Megatron)) {
        Err(CheckpointError::NotADirectory { path }) => assert_eq!(path, file),
        other => panic!("{other:?}"),
    }
}

#[cfg(unix)]
#[test]
fn links_out_of_the_directory_are_not_followed() {
    use std::os::unix::fs::symlink;

    let outside = tmp();
    put(outside.path(), "checkpoint-900/model.safetensors", b"w");
    put(
        outside.path(),
        "checkpoint-900/trainer_state.json",
        &trainer_state(900),
    );
    put(outside.path(), "tracker", b"900");

    let dir = tmp();
    let root = dir.path();
    put(root, "checkpoint-100/model.safetensors", b"w");
    put(
        root,
        "checkpoint-100/trainer_state.json",
        &trainer_state(100),
    );
    symlink(
        outside.path().join("checkpoint-900"),
        root.join("checkpoint-900"),
    )
    .expect("ln -s");
    // A link that stays inside is followed.
    put(root, "kept/a/model.safetensors", b"w");
    put(root, "kept/a/trainer_state.json", &trainer_state(150));
    symlink(root.join("kept/a"), root.join("checkpoint-150")).expect("ln -s");
    put(root, "checkpoint-200/model.safetensors", b"w");
    symlink(
        outside.path().join("checkpoint-900/trainer_state.json"),
        root.join("checkpoint-200/trainer_state.json"),
    )
    .expect("ln -s");

    assert_eq!(latest(root), at(root, "checkpoint-150", 150, "huggingface"));
    assert_eq!(
        skipped(root),
        vec![
            "skipped checkpoint-900: links outside the checkpoint directory",
            "skipped checkpoint-200: trainer_state.json links outside the checkpoint directory",
        ]
    );

    let dir = tmp();
    let root = dir.path();
    megatron_legacy(root, 900, &[0]);
    symlink(
        outside.path().join("tracker"),
        root.join("latest_checkpointed_iteration.txt"),
    )
    .expect("ln -s");
    match latest_complete(root, Some(Format::Megatron)) {
        Err(CheckpointError::Tracker { path, what }) => {
            assert_eq!(path, root.join("latest_checkpointed_iteration.txt"));
            assert_eq!(what, "links outside the checkpoint directory");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn skipped_lines_name_what_the_timeline_shows() {
    let dir = tmp();
    let root = dir.path();
    megatron_legacy(root, 100, &[0, 1]);
    megatron_legacy(root, 200, &[0, 2]);
    tracker(root, "100");
    let scan = scan(root, None).expect("scan");
    let chosen = scan.chosen().expect("one complete");
    assert_eq!(chosen.describe(), "iter_0000100: complete (step 100)");
    assert_eq!(chosen.path, root.join("iter_0000100"));
    assert_eq!(scan.candidates.len(), 2);
    assert!(!scan.candidates[0].is_complete());
}
