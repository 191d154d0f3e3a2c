//! Parity with Ultralytics: the CLI's detections on `shared/images` against the reference
//! detections Ultralytics' own pipeline produced, for each shared model.
//!
//! A reference detection is found when Peregrine has one of the same class with IoU >= 0.9
//! and a score within 0.02; at least 99% must be found, and at least 99% of Peregrine's
//! detections must match a reference one.

mod common;

use common::{matches, reference, shared_dir, Det};

fn check_parity(model: &str) {
    let refs = reference(model);
    let model_path = shared_dir().join("models").join(format!("{model}.onnx"));
    let images: Vec<String> = refs
        .iter()
        .map(|(name, _)| shared_dir().join("images").join(name).display().to_string())
        .collect();
    let mut args = vec![
        "detect".to_string(),
        "--model".into(),
        model_path.display().to_string(),
    ];
    args.extend(images);
    let ours = common::detect_json(&args);
    assert_eq!(ours.len(), refs.len(), "one JSON line per image");

    let (mut ref_total, mut ours_total, mut matched) = (0, 0, 0);
    for ((name, ref_dets), line) in refs.iter().zip(&ours) {
        assert!(line["image"].as_str().unwrap().ends_with(name.as_str()));
        let our_dets = Det::list(&line["detections"]);
        let m = matches(ref_dets, &our_dets);
        if m != ref_dets.len() || m != our_dets.len() {
            eprintln!(
                "{model} {name}: reference {}, ours {}, matched {m}",
                ref_dets.len(),
                our_dets.len()
            );
        }
        ref_total += ref_dets.len();
        ours_total += our_dets.len();
        matched += m;
    }
    let recall = matched as f64 / ref_total as f64;
    let precision = matched as f64 / ours_total as f64;
    eprintln!("{model}: {matched} matched of {ref_total} reference and {ours_total} ours (recall {recall:.4}, precision {precision:.4})");
    assert!(ref_total > 20, "the reference should not be trivially small");
    assert!(recall >= 0.99, "{model}: recall {recall:.4} < 0.99");
    assert!(precision >= 0.99, "{model}: precision {precision:.4} < 0.99");
}

#[test]
fn parity_yolo11n() {
    check_parity("yolo11n");
}

#[test]
fn parity_yolo26n_end_to_end() {
    check_parity("yolo26n-e2e");
}

#[test]
fn embedded_model_matches_the_shared_yolo11n() {
    let img = shared_dir().join("images/bus.jpg").display().to_string();
    let embedded = common::detect_json(&["detect".into(), img.clone()]);
    let model = shared_dir().join("models/yolo11n.onnx").display().to_string();
    let explicit = common::detect_json(&["detect".into(), "--model".into(), model, img]);
    assert_eq!(embedded[0]["detections"], explicit[0]["detections"]);
    assert!(!embedded[0]["detections"].as_array().unwrap().is_empty());
}

/// The graph rewrite (uint8 canvas in, top-K candidates out, normalisation and the best
/// class scan inside the graph) gives exactly the plain path's detections on the CPU. Both
/// `on` and `auto` fold the DFL on the CPU, so they must agree exactly; against `off` (the
/// model as exported) the fold may move a box by one step of the JSON's 0.01 px rounding,
/// and nothing else.
fn check_rewrite_is_exact(model: &str) {
    let model_path = shared_dir().join("models").join(format!("{model}.onnx"));
    let images: Vec<String> = reference(model)
        .iter()
        .map(|(name, _)| shared_dir().join("images").join(name).display().to_string())
        .collect();
    let run = |rewrite: &str| {
        let mut args = vec![
            "detect".to_string(),
            "--model".into(),
            model_path.display().to_string(),
            "--graph-rewrite".into(),
            rewrite.into(),
            "--batch".into(),
            "2".into(),
        ];
        args.extend(images.iter().cloned());
        common::detect_json(&args)
    };
    let (plain, folded, rewritten) = (run("off"), run("auto"), run("on"));
    assert_eq!(plain.len(), rewritten.len());
    for (f, r) in folded.iter().zip(&rewritten) {
        assert_eq!(
            f, r,
            "the rewritten graph changed the detections of {}",
            f["image"]
        );
    }
    let mut moved = 0;
    for (p, f) in plain.iter().zip(&folded) {
        let (pd, fd) = (
            p["detections"].as_array().unwrap(),
            f["detections"].as_array().unwrap(),
        );
        assert_eq!(
            pd.len(),
            fd.len(),
            "the DFL fold changed the detection count of {}",
            p["image"]
        );
        for (a, b) in pd.iter().zip(fd) {
            assert_eq!(a["class_id"], b["class_id"], "{}", p["image"]);
            assert_eq!(a["score"], b["score"], "{}", p["image"]);
            let (ab, bb) = (a["box"].as_array().unwrap(), b["box"].as_array().unwrap());
            for (x, y) in ab.iter().zip(bb) {
                let d = (x.as_f64().unwrap() - y.as_f64().unwrap()).abs();
                assert!(d < 0.0105, "the DFL fold moved a box of {} by {d} px", p["image"]);
                moved += usize::from(d > 0.0);
            }
        }
    }
    eprintln!("{model}: the DFL fold moved {moved} box coordinates by one 0.01 px step");
}

#[test]
fn rewritten_graph_is_exact_yolo11n() {
    check_rewrite_is_exact("yolo11n");
}

#[test]
fn rewritten_graph_is_exact_yolo26n_end_to_end() {
    check_rewrite_is_exact("yolo26n-e2e");
}
