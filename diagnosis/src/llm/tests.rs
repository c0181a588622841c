//! Unit tests of the LLM client's pure parts: prompt, answer validation, backoff.

use serde_json::json;

use super::answer::{self, AnswerError, contains_token, strip_fences};
use super::prompt::{self, ResponseMode};
use super::*;
use crate::model::{Category, Culprit, FaultLocus};

fn line(id: u64, text: &str) -> EvidenceLine {
    EvidenceLine {
        id,
        text: text.to_owned(),
        rule_id: None,
        reason: "rule".to_owned(),
        score: 1.0,
    }
}

fn rules() -> Diagnosis {
    Diagnosis {
        category: Some(Category::NcclTimeoutHang),
        fault_locus: Some(FaultLocus::Network),
        culprit: Culprit {
            ranks: vec![7],
            nodes: vec!["gpu-node-26".to_owned()],
            gpus: vec![],
            text: "rank 7 (gpu-node-26)".to_owned(),
            ..Culprit::default()
        },
        confidence: 0.6,
        rule_ids: vec!["nccl.watchdog".to_owned()],
        evidence: vec![],
        explanation: "watchdog timeout [3]".to_owned(),
        source: "rules".to_owned(),
        recommended_action: None,
    }
}

fn evidence() -> Vec<EvidenceLine> {
    vec![
        line(
            3,
            "[rank7]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout",
        ),
        line(
            9,
            "gpu-node-26 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
        ),
        line(12, "rank 12 on gpu-node-27 waiting; GPU 3 busy"),
    ]
}

fn built() -> prompt::Prompt {
    let cfg = LlmConfig::new("http://127.0.0.1:1/v1", "m");
    let red = Redactor::new(RedactOptions {
        hosts: true,
        ips: true,
    });
    prompt::build(&cfg, &red, &rules(), &evidence()).expect("fits")
}

/// Validates `answer` (a JSON value) against the standard prompt.
fn check(answer: serde_json::Value) -> Result<Answer, AnswerError> {
    answer::validate(&answer.to_string(), &built())
}

fn good() -> serde_json::Value {
    json!({
        "category": "gpu_hardware_xid",
        "fault_locus": "hardware",
        "culprit": {"ranks": [7], "nodes": ["host-1"], "gpus": ["0000:3b:00"], "text": "rank 7 on host-1"},
        "confidence": 0.9,
        "evidence_ids": [9],
        "explanation": "XID 79 on host-1 [9] explains the timeout [3].",
        "recommended_action": "Drain host-1 and run GPU diagnostics."
    })
}

#[test]
fn a_good_answer_is_accepted() {
    let a = check(good()).expect("valid");
    assert_eq!(a.category, Some(Category::GpuHardwareXid));
    assert_eq!(a.fault_locus, Some(FaultLocus::Hardware));
    assert_eq!(a.culprit.ranks, [7]);
    assert_eq!(a.culprit.nodes, ["host-1"]);
    assert_eq!(a.culprit.gpus, ["0000:3b:00"]);
    assert_eq!(a.culprit.text, "rank 7 on host-1");
    assert!(a.dropped.is_empty());
}

#[test]
fn the_prompt_is_redacted_and_tagged() {
    let p = built();
    assert!(!p.user.contains("gpu-node-26"), "{}", p.user);
    assert!(p.user.contains("host-1"));
    assert_eq!(p.sent_ids, [3, 9, 12]);
    assert_eq!(p.hint_nodes, ["host-1"]);
    let v: serde_json::Value = serde_json::from_str(&p.user).expect("user message is JSON");
    assert_eq!(v["evidence"][1]["id"], 9);
    assert_eq!(v["rules_answer"]["category"], "nccl_timeout_hang");
    assert_eq!(v["allowed_categories"].as_array().map(Vec::len), Some(13));
}

#[test]
fn evidence_is_trimmed_to_the_request_limit() {
    let mut cfg = LlmConfig::new("http://127.0.0.1:1/v1", "m");
    let many: Vec<EvidenceLine> = (0..40).map(|i| line(i, &"x".repeat(300))).collect();
    let red = Redactor::default();
    let full = prompt::build(&cfg, &red, &rules(), &many).expect("fits");
    assert_eq!(full.sent_ids.len(), 40);
    cfg.max_tokens_per_request = 3_000;
    let cut = prompt::build(&cfg, &red, &rules(), &many).expect("fits");
    assert!(cut.sent_ids.len() < 40 && !cut.sent_ids.is_empty());
    assert_eq!(cut.sent_ids[0], 0, "the most telling lines are kept");
    assert!(cut.prompt_tokens + cfg.max_answer_tokens <= 3_000);
    cfg.max_tokens_per_request = 900;
    assert!(prompt::build(&cfg, &red, &rules(), &many).is_err());
}

#[test]
fn request_bodies_per_mode() {
    let cfg = LlmConfig::new("http://127.0.0.1:1/v1", "m");
    let p = built();
    let b = prompt::body(&cfg, &p, ResponseMode::JsonSchema);
    assert_eq!(b["response_format"]["type"], "json_schema");
    assert_eq!(b["response_format"]["json_schema"]["strict"], true);
    let b = prompt::body(&cfg, &p, ResponseMode::JsonObject);
    assert_eq!(b["response_format"]["type"], "json_object");
    assert!(
        b["messages"][0]["content"]
            .as_str()
            .is_some_and(|s| s.contains("\"explanation\""))
    );
    let b = prompt::body(&cfg, &p, ResponseMode::Plain);
    assert!(b.get("response_format").is_none());
}

#[test]
fn fences_are_stripped() {
    assert_eq!(strip_fences("```json\n{\"a\":1}\n```"), "{\"a\":1}");
    assert_eq!(strip_fences("```\n{}\n```\n"), "{}");
    assert_eq!(strip_fences("  {} "), "{}");
    let fenced = format!("```json\n{}\n```", good());
    assert!(answer::validate(&fenced, &built()).is_ok());
}

#[test]
fn answers_that_break_the_schema_are_rejected() {
    let with = |path: &[&str], v: serde_json::Value| {
        let mut a = good();
        let mut at = &mut a;
        for (i, k) in path.iter().enumerate() {
            if i + 1 == path.len() {
                at[*k] = v.clone();
            } else {
                at = &mut at[*k];
            }
        }
        a
    };
    let cases: Vec<(&str, serde_json::Value)> = vec![
        (
            "category not in the set",
            with(&["category"], json!("cosmic_rays")),
        ),
        (
            "locus not in the set",
            with(&["fault_locus"], json!("the-moon")),
        ),
        ("confidence 7", with(&["confidence"], json!(7))),
        ("negative confidence", with(&["confidence"], json!(-0.1))),
        (
            "cites a line not sent",
            with(&["explanation"], json!("see [99]")),
        ),
        (
            "evidence id not sent",
            with(&["evidence_ids"], json!([9, 1000])),
        ),
        ("cites nothing", {
            let mut a = with(&["explanation"], json!("trust me"));
            a["evidence_ids"] = json!([]);
            a
        }),
        (
            "explanation too long",
            with(&["explanation"], json!(format!("[9] {}", "a".repeat(3000)))),
        ),
        (
            "action too long",
            with(&["recommended_action"], json!("b".repeat(600))),
        ),
        (
            "unknown field",
            with(&["execute"], json!("kubectl drain --all")),
        ),
        (
            "unknown culprit field",
            with(&["culprit", "shell"], json!("rm -rf /")),
        ),
        (
            "rank is not a number",
            with(&["culprit", "ranks"], json!(["all"])),
        ),
        (
            "too many nodes",
            with(&["culprit", "nodes"], json!(vec!["host-1"; 65])),
        ),
    ];
    for (why, a) in cases {
        assert!(check(a).is_err(), "{why} must be rejected");
    }
    assert!(matches!(
        answer::validate("{\"category\": \"gpu_oom\", \"fault", &built()),
        Err(AnswerError::Malformed(_))
    ));
}

#[test]
fn culprits_the_evidence_does_not_show_are_dropped() {
    let mut a = good();
    a["culprit"] = json!({
        "ranks": [7, 12, 400],
        "nodes": ["host-1", "host-2", "host-9", "gpu-node-99"],
        "gpus": ["3", "5", "0000:3b:00", "GPU-deadbeef"],
        "text": "everything on host-9"
    });
    let got = check(a).expect("valid once dropped");
    assert_eq!(got.culprit.ranks, [7, 12]);
    assert_eq!(got.culprit.nodes, ["host-1", "host-2"]);
    assert_eq!(got.culprit.gpus, ["3", "0000:3b:00"]);
    assert_eq!(
        got.culprit.text,
        "rank 7, 12; node host-1, host-2; GPU 3, 0000:3b:00"
    );
    assert_eq!(
        got.dropped,
        [
            "rank 400",
            "node host-9",
            "node gpu-node-99",
            "GPU 5",
            "GPU GPU-deadbeef"
        ]
    );
}

#[test]
fn envelope_errors_are_told_apart() {
    let truncated =
        json!({"choices": [{"message": {"content": "{\"cat"}, "finish_reason": "length"}]});
    assert_eq!(
        answer::parse_envelope(truncated.to_string().as_bytes()),
        Err(AnswerError::Truncated)
    );
    assert!(matches!(
        answer::parse_envelope(b"<html>"),
        Err(AnswerError::Malformed(_))
    ));
    assert!(matches!(
        answer::parse_envelope(br#"{"choices": []}"#),
        Err(AnswerError::Malformed(_))
    ));
    let ok = json!({"choices": [{"message": {"role": "assistant", "content": "{}"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}});
    let c = answer::parse_envelope(ok.to_string().as_bytes()).expect("ok");
    assert_eq!((c.content.as_str(), c.total_tokens), ("{}", Some(12)));
}

#[test]
fn tokens_are_whole_words() {
    assert!(contains_token("on host-1 now", "host-1"));
    assert!(contains_token("host-1.", "host-1"));
    assert!(!contains_token("host-12", "host-1"));
    assert!(!contains_token("host-1.example.com", "host-1"));
    assert!(!contains_token("xhost-1", "host-1"));
}

#[test]
fn backoff_doubles_honours_retry_after_and_is_capped() {
    let a = backoff(100, 0, 1, None);
    let b = backoff(100, 1, 1, None);
    assert!(
        a >= Duration::from_millis(50) && a <= Duration::from_millis(100),
        "{a:?}"
    );
    assert!(
        b >= Duration::from_millis(100) && b <= Duration::from_millis(200),
        "{b:?}"
    );
    assert_eq!(backoff(100, 0, 1, Some(3)), Duration::from_secs(3));
    assert_eq!(backoff(100, 0, 1, Some(3600)), MAX_BACKOFF);
    let late = backoff(1000, 30, 1, None);
    assert!(late >= MAX_BACKOFF / 2 && late <= MAX_BACKOFF, "{late:?}");
}

#[test]
fn budget_windows_reset() {
    let mut b = Budget {
        limit: 100,
        window: None,
        used: 0,
        started: Instant::now(),
    };
    b.reserve(60).expect("fits");
    assert!(matches!(
        b.reserve(50),
        Err(LlmError::Budget {
            used: 60,
            limit: 100,
            needed: 50
        })
    ));
    b.settle(60, 20);
    b.reserve(50)
        .expect("fits after settling to the real spend");
    assert_eq!(b.used, 70);
}

#[tokio::test(start_paused = true)]
async fn budget_window_rolls_over() {
    let mut b = Budget {
        limit: 100,
        window: Some(Duration::from_secs(60)),
        used: 0,
        started: Instant::now(),
    };
    b.reserve(90).expect("fits");
    assert!(b.reserve(20).is_err());
    tokio::time::advance(Duration::from_secs(61)).await;
    b.reserve(20).expect("a new window");
}

#[test]
fn an_error_body_that_echoes_our_key_loses_it_whatever_its_shape() {
    let key = ApiKey::new("lkq_Zp8TnW4vXy6Rb2Mc9Hd3Jf");
    // Past the 200 characters kept, too: the key is cut before the text is.
    let body = format!(
        "{{\"error\": \"Incorrect API key provided: {}\"}}{}",
        key.expose(),
        " ".repeat(300)
    );
    let text = error_text(body.as_bytes(), &Redactor::default(), Some(&key));
    assert!(!text.contains("lkq_Zp8TnW4v"), "{text}");
    assert!(
        text.contains("Incorrect API key provided: [REDACTED:api-key]"),
        "{text}"
    );
    // Without the key the shape alone does not give it away: this is what the
    // by-value cut is for.
    let text = error_text(body.as_bytes(), &Redactor::default(), None);
    assert!(text.contains(key.expose()), "{text}");
}
