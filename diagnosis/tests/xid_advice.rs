//! The advice `warden diagnose` gives on an XID agrees with the XID catalog
//! (`rules/xid.yaml`): for every code the catalog lists, a kernel line reporting it is
//! diagnosed, and the advice carries the catalog's action, says to fix the program (and
//! never to drain the node) when the application causes the XID, and says to replace
//! the GPU only where the catalog's own action does.

use warden_diagnosis::model::FaultLocus;
use warden_diagnosis::rules::RuleSet;
use warden_diagnosis::{PipelineOptions, diagnose_lines, model::LogLine};
use warden_model::xid::{Cause, XidCatalog};

fn line(id: u64, text: &str) -> LogLine {
    LogLine {
        id,
        text: text.to_owned(),
        ..LogLine::default()
    }
}

/// Words that tell an operator to swap the hardware.
const REPLACE: [&str; 4] = ["replace the gpu", "replace it", "rma", "return the gpu"];

#[test]
fn no_advice_contradicts_the_xid_catalog() {
    let rules = RuleSet::builtin().expect("shipped rules load");
    let catalog = XidCatalog::builtin();
    assert!(catalog.len() > 100, "the catalog loads");
    let opts = PipelineOptions::default();
    let mut checked = 0;
    let mut problems = Vec::new();
    for info in catalog.entries() {
        let code = info.code;
        let text = format!(
            "[ 8812.443210] NVRM: Xid (PCI:0000:3b:00): {code}, pid=4411, name=python3, Ch 00000008"
        );
        let d = diagnose_lines(&rules, &[line(1, &text)], &opts);
        let Some(advice) = d.recommended_action.as_deref() else {
            problems.push(format!("XID {code}: no advice at all"));
            continue;
        };
        checked += 1;
        let lower = advice.to_ascii_lowercase();
        if !advice.contains(&info.action) {
            problems.push(format!(
                "XID {code}: advice {advice:?} leaves out the catalog's action {:?}",
                info.action
            ));
        }
        let catalog_replaces = {
            let a = info.action.to_ascii_lowercase();
            a.contains("rma") || a.contains("field diag") || a.contains("replace")
        };
        if !catalog_replaces && REPLACE.iter().any(|w| lower.contains(w)) {
            problems.push(format!(
                "XID {code} ({:?} cause): advice says to replace the GPU: {advice:?}",
                info.cause
            ));
        }
        if info.cause == Cause::Application {
            if lower.contains("drain") {
                problems.push(format!(
                    "XID {code} is the application's: advice drains the node: {advice:?}"
                ));
            }
            if d.fault_locus == Some(FaultLocus::Hardware) {
                problems.push(format!(
                    "XID {code} is the application's: the locus is hardware"
                ));
            }
        }
        if let Some(known) = &info.known
            && !advice.contains(known.as_str())
        {
            problems.push(format!(
                "XID {code}: advice {advice:?} leaves out the known cause {known:?}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(checked, catalog.len());
}

/// The driver faults the catalog names by their known cause (GSP timeouts, the
/// microcontroller halt, the recovery-action XID) are answered with a driver update,
/// never a new GPU.
#[test]
fn gsp_and_microcontroller_xids_advise_a_driver_update_not_a_new_gpu() {
    let rules = RuleSet::builtin().expect("shipped rules load");
    let opts = PipelineOptions::default();
    for (code, tail) in [
        (
            119,
            "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL)",
        ),
        (62, "0a3e2b4c 0a3e2b54 0a3e2a6a"),
        (
            154,
            "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        ),
    ] {
        let text = format!("NVRM: Xid (PCI:0000:b7:00): {code}, pid=2345, name=python, {tail}");
        let d = diagnose_lines(&rules, &[line(1, &text)], &opts);
        let advice = d
            .recommended_action
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(
            !REPLACE.iter().any(|w| advice.contains(w)),
            "XID {code}: {advice}"
        );
        if code != 154 {
            assert!(advice.contains("update the driver"), "XID {code}: {advice}");
        }
    }
}
