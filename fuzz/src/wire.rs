//! Fuzz target: the agent-to-controller wire decoder (`warden_model::wire`).
//!
//! Every input goes through `Batch::decode_binary` as sent (envelope included), again
//! inside a valid envelope (so the protobuf decoder and `validate` see every input), and
//! through `Batch::decode_json`. Nothing may panic, and whatever decodes must survive a
//! round trip: encode → decode gives the same bytes again, the sealed form stamped with
//! `frame_sealed` decodes to the same batch, and the JSON form of a batch decodes to the
//! same batch (when its GPU readings are finite: JSON has no literal for NaN), up to
//! what the JSON form cannot say: NaN payload bits, enum numbers this version does not
//! know (written as their default label), and the last bit of a float (serde_json's
//! default number parser may round to a neighbour; the binary form is exact).

use warden_model::wire::{
    Batch, CollOp, ENVELOPE_LEN, EventSeverity, LogStream, MAGIC, NodeEventKind, WIRE_VERSION,
    frame_sealed,
};

/// One input, as libFuzzer passes it (`fuzz_targets/wire.rs`).
pub fn run(data: &[u8]) {
    if let Ok(b) = Batch::decode_binary(data) {
        round_trip(&b);
    }
    let mut framed = Vec::with_capacity(ENVELOPE_LEN + data.len());
    framed.extend_from_slice(MAGIC);
    framed.push(WIRE_VERSION);
    framed.extend_from_slice(&(data.len() as u32).to_le_bytes());
    framed.extend_from_slice(data);
    match Batch::decode_binary(&framed) {
        Ok(b) => round_trip(&b),
        Err(e) => {
            // Every refusal has one of the bounded metric labels.
            assert!(!e.reason().is_empty());
        }
    }
    if let Ok(b) = Batch::decode_json(data) {
        round_trip(&b);
    }
}

/// The invariants of a batch that decoded.
fn round_trip(b: &Batch) {
    let bytes = b.encode_binary();
    let again = Batch::decode_binary(&bytes).expect("an encoded valid batch decodes");
    assert_eq!(
        again.encode_binary(),
        bytes,
        "decode → encode → decode changed the batch"
    );

    // The agent's path: seal without the send time, stamp it when it goes out.
    let mut out = Vec::new();
    frame_sealed(&b.seal(), b.sent_at_ns, &mut out);
    let stamped = Batch::decode_binary(&out).expect("a sealed and stamped batch decodes");
    assert_eq!(
        stamped.encode_binary(),
        bytes,
        "sealing and stamping changed the batch"
    );

    let finite = b
        .gpus
        .iter()
        .all(|g| g.util_pct.is_finite() && g.temp_c.is_finite() && g.power_w.is_finite());
    if finite {
        let json = b.encode_json();
        let from_json = match Batch::decode_json(&json) {
            Ok(j) => j,
            Err(e) => panic!(
                "the JSON form of a valid batch does not decode: {e}\n{}",
                String::from_utf8_lossy(&json)
            ),
        };
        let (got, want) = (normal(from_json), normal(b.clone()));
        assert_eq!(
            without_floats(got.clone()).encode_binary(),
            without_floats(want.clone()).encode_binary(),
            "binary → JSON → binary changed the batch"
        );
        for (g, w) in floats(&got).into_iter().zip(floats(&want)) {
            assert!(
                within_an_ulp(g, w),
                "binary → JSON → binary moved a float from {w:?} to {g:?}"
            );
        }
    }
}

/// The batch as its JSON form says it: version 1, one NaN, known enum numbers.
fn normal(mut b: Batch) -> Batch {
    let nan = |v: &mut Option<f64>| {
        if v.is_some_and(f64::is_nan) {
            *v = Some(f64::NAN);
        }
    };
    b.version = u32::from(WIRE_VERSION);
    for j in &mut b.jobs {
        for c in &mut j.collectives {
            c.op = CollOp::from_wire(c.op) as i32;
        }
        for m in &mut j.metrics {
            nan(&mut m.loss);
            nan(&mut m.grad_norm);
            nan(&mut m.tokens_per_s);
        }
        for l in &mut j.logs {
            l.stream = LogStream::from_wire(l.stream) as i32;
        }
    }
    for e in &mut b.events {
        e.kind = NodeEventKind::from_wire(e.kind) as i32;
        e.severity = EventSeverity::from_wire(e.severity) as i32;
    }
    b
}

/// Every float of a batch, in order, each in its own width.
fn floats(b: &Batch) -> Vec<Float> {
    let mut out = Vec::new();
    for j in &b.jobs {
        for m in &j.metrics {
            for v in [m.loss, m.grad_norm, m.tokens_per_s].into_iter().flatten() {
                out.push(Float::F64(v));
            }
        }
    }
    for g in &b.gpus {
        out.extend([g.util_pct, g.temp_c, g.power_w].map(Float::F32));
    }
    out
}

#[derive(Debug, Clone, Copy)]
enum Float {
    F64(f64),
    F32(f32),
}

/// Equal, both NaN, or neighbours.
fn within_an_ulp(a: Float, b: Float) -> bool {
    match (a, b) {
        (Float::F64(a), Float::F64(b)) => {
            a == b || (a.is_nan() && b.is_nan()) || a.to_bits().abs_diff(b.to_bits()) <= 1
        }
        (Float::F32(a), Float::F32(b)) => {
            a == b || (a.is_nan() && b.is_nan()) || a.to_bits().abs_diff(b.to_bits()) <= 1
        }
        _ => false,
    }
}

/// The batch with every float set to zero (presence kept).
fn without_floats(mut b: Batch) -> Batch {
    for j in &mut b.jobs {
        for m in &mut j.metrics {
            for v in [&mut m.loss, &mut m.grad_norm, &mut m.tokens_per_s] {
                if v.is_some() {
                    *v = Some(0.0);
                }
            }
        }
    }
    for g in &mut b.gpus {
        g.util_pct = 0.0;
        g.temp_c = 0.0;
        g.power_w = 0.0;
    }
    b
}
