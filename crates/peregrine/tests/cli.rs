//! The `peregrine detect` command as a user meets it: bad files, flags, outputs.

mod common;

use std::path::Path;

use common::{image, peregrine, TempDir};

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// A PNG header that claims 100000 x 100000 pixels.
fn huge_png() -> Vec<u8> {
    let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    png.extend_from_slice(&100_000u32.to_be_bytes());
    png.extend_from_slice(&100_000u32.to_be_bytes());
    png.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
    png
}

#[test]
fn bad_files_are_reported_and_the_rest_processed() {
    let dir = TempDir::new("bad");
    let bus = std::fs::read(image("bus.jpg")).unwrap();
    std::fs::copy(image("zidane.jpg"), dir.path().join("a_good.jpg")).unwrap();
    dir.file("b_garbage.jpg", b"this is not a picture at all");
    dir.file("c_empty.png", b"");
    dir.file("d_truncated.jpg", &bus[..bus.len() / 2]);
    dir.file("e_huge.png", &huge_png());
    dir.file("f_tiny_truncated.jpg", &bus[..20]);

    let out = peregrine(&args(&["detect", dir.path().to_str().unwrap()]));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed image makes the exit status 1"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "only the good image has output: {stdout}");
    assert!(lines[0].contains("a_good.jpg") && lines[0].contains("person"));
    for (file, says) in [
        ("b_garbage.jpg", "not an image in a supported format"),
        ("c_empty.png", "empty"),
        ("d_truncated.jpg", "truncated"),
        ("e_huge.png", "100000x100000 pixels, over the limit"),
        ("f_tiny_truncated.jpg", "JPEG"),
    ] {
        let line = stderr
            .lines()
            .find(|l| l.contains(file))
            .unwrap_or_else(|| panic!("no error for {file}: {stderr}"));
        assert!(line.contains(says), "{file}: {line}");
    }
}

#[test]
fn max_pixels_is_configurable() {
    let out = peregrine(&args(&["detect", "--max-pixels", "1000", &image("bus.jpg")]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("810x1080 pixels, over the limit of 1000"),
        "{stderr}"
    );
}

#[test]
fn missing_inputs_and_bad_flags_are_clear() {
    let out = peregrine(&args(&["detect", "/no/such/photo.jpg"]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("/no/such/photo.jpg: no such file or directory"),
        "{stderr}"
    );

    let out = peregrine(&args(&["detect", "--conf", "2", &image("bus.jpg")]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("conf is 2, outside the allowed range 0 to 1"));

    let out = peregrine(&args(&["detect", "--classes", "unicorn", &image("bus.jpg")]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("unknown class \"unicorn\""));

    let out = peregrine(&args(&["detect", "--model", "/no/model.onnx", &image("bus.jpg")]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("cannot read /no/model.onnx"));

    let dir = TempDir::new("badmodel");
    let model = dir.file("broken.onnx", b"not a protobuf");
    let out = peregrine(&args(&["detect", "--model", &model, &image("bus.jpg")]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("could not load the model"), "{stderr}");
}

/// A model whose input size is fixed refuses another `--imgsz`, and says why once (the
/// cause was printed twice when an error quoted its source and also chained it).
#[test]
fn a_size_a_fixed_model_cannot_run_at_is_refused_once() {
    let model = common::shared_dir().join("models/yolo26n-e2e.onnx");
    let out = peregrine(&args(&[
        "detect",
        "--model",
        model.to_str().unwrap(),
        "--imgsz",
        "384,640",
        &image("bus.jpg"),
    ]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    let why = "the model's input is fixed at 640x640; it cannot run at the requested 384x640";
    assert_eq!(stderr.matches(why).count(), 1, "{stderr}");
}

#[test]
fn a_missing_runtime_library_says_what_to_do() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(["detect", &image("bus.jpg")])
        .env("ORT_DYLIB_PATH", "/nonexistent/libonnxruntime.so")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("ONNX Runtime 1.31.1 was not found"), "{stderr}");
    assert!(
        stderr.contains("make setup") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

#[test]
fn a_runtime_of_the_wrong_kind_is_refused_without_panicking() {
    // Any shared library that is not ONNX Runtime stands in for a wrong one.
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/aarch64-linux-gnu/libc.so.6",
        "/usr/lib/libc.so.6",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .expect("a libc to stand in for a wrong library");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(["detect", &image("bus.jpg")])
        .env("ORT_DYLIB_PATH", libc)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("could not load ONNX Runtime"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn class_filter_conf_and_max_det_apply() {
    let bus = image("bus.jpg");
    let all = common::detect_json(&args(&["detect", &bus]));
    let people = common::detect_json(&args(&["detect", "--classes", "person", &bus]));
    let dets = |v: &serde_json::Value| v["detections"].as_array().unwrap().clone();
    let n_people = dets(&all[0])
        .iter()
        .filter(|d| d["class_name"] == "person")
        .count();
    assert!(n_people >= 3);
    assert_eq!(dets(&people[0]).len(), n_people);
    assert!(dets(&people[0]).iter().all(|d| d["class_id"] == 0));

    let by_id = common::detect_json(&args(&["detect", "--classes", "5", &bus]));
    assert_eq!(dets(&by_id[0]).len(), 1);
    assert_eq!(dets(&by_id[0])[0]["class_name"], "bus");

    let strict = common::detect_json(&args(&["detect", "--conf", "0.8", &bus]));
    let confident = dets(&strict[0]);
    // The bus (0.94) and three people (0.90, 0.85, 0.83); the fourth person scores 0.40.
    assert_eq!(confident.len(), 4, "{confident:?}");
    assert!(confident.iter().all(|d| d["score"].as_f64().unwrap() > 0.8));
    assert!(confident.len() < dets(&all[0]).len());

    let two = common::detect_json(&args(&["detect", "--max-det", "2", &bus]));
    assert_eq!(dets(&two[0]).len(), 2);
}

#[test]
fn batching_gives_the_same_results_as_one_by_one() {
    let imgs = [image("bus.jpg"), image("zidane.jpg"), image("giraffe.jpg")];
    let mut a = args(&["detect"]);
    a.extend(imgs.iter().cloned());
    let single = common::detect_json(&a);
    let mut b = args(&["detect", "--batch", "3"]);
    b.extend(imgs.iter().cloned());
    let batched = common::detect_json(&b);
    assert_eq!((single.len(), batched.len()), (3, 3));
    for (s, b) in single.iter().zip(&batched) {
        assert_eq!(s["image"], b["image"], "the same order");
        let (s, b) = (
            common::Det::list(&s["detections"]),
            common::Det::list(&b["detections"]),
        );
        assert_eq!(s.len(), b.len());
        for (x, y) in s.iter().zip(&b) {
            assert_eq!(x.class_id, y.class_id);
            assert!((x.score - y.score).abs() < 1e-3 && x.iou(y) > 0.99);
        }
    }
}

#[test]
fn save_writes_annotated_images_and_table_format_is_readable() {
    let dir = TempDir::new("save");
    let out = peregrine(&args(&[
        "detect",
        "--format",
        "table",
        "--save",
        dir.path().to_str().unwrap(),
        &image("bus.jpg"),
        &image("astronaut.png"),
    ]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("bus.jpg (810x1080): 5 detections"), "{stdout}");
    let saved = image::open(dir.path().join("bus.jpg")).unwrap().to_rgb8();
    let original = image::open(image("bus.jpg")).unwrap().to_rgb8();
    assert_eq!(saved.dimensions(), original.dimensions());
    // The bus box's top edge (y = 228) is drawn in the class colour, unlike the photo.
    let changed = (100..700)
        .filter(|&x| saved.get_pixel(x, 229) != original.get_pixel(x, 229))
        .count();
    assert!(changed > 400, "only {changed} pixels changed along the box edge");
    assert!(dir.path().join("astronaut.png").exists());
}

#[test]
fn an_unavailable_provider_is_an_error_unless_fallback_is_asked_for() {
    // The CPU build of ONNX Runtime has no CUDA provider.
    let bus = image("bus.jpg");
    let out = peregrine(&args(&["detect", "--provider", "cuda", &bus]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("execution provider cuda is not available"),
        "{stderr}"
    );
    let out = peregrine(&args(&[
        "detect",
        "--provider",
        "cuda",
        "--provider-fallback",
        &bus,
    ]));
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("falling back to the CPU"),
        "the fallback is logged: {stderr}"
    );
    assert!(String::from_utf8(out.stdout).unwrap().contains("\"bus\""));
}
