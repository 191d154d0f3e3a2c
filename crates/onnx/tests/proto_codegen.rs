//! The checked-in `src/proto/onnx.rs` must be exactly what prost-build makes of the checked-in
//! `proto/onnx.proto`. The generated code is committed (rather than built by a `build.rs`) so
//! that building the server never compiles a protobuf compiler; this test is what keeps the
//! two from drifting apart.
//!
//! To regenerate after changing the `.proto` or bumping prost:
//! `PEREGRINE_ONNX_REGENERATE=1 cargo test -p peregrine-onnx --test proto_codegen` rewrites the
//! file and fails if that changed it; review the diff, commit it and run the test again.

use std::path::Path;

#[test]
fn checked_in_code_is_what_prost_build_generates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // protox is a pure-Rust protoc: no system protobuf compiler needed.
    let fds = protox::compile(["onnx.proto"], [root.join("proto")]).expect("proto/onnx.proto compiles");
    let out = std::env::temp_dir().join(format!("peregrine-onnx-codegen-{}", std::process::id()));
    std::fs::create_dir_all(&out).expect("temp dir");
    prost_build::Config::new()
        .out_dir(&out)
        .compile_fds(fds)
        .expect("prost-build generates code");
    let generated = std::fs::read_to_string(out.join("onnx.rs")).expect("generated onnx.rs");
    let _ = std::fs::remove_dir_all(&out);

    let checked_in_path = root.join("src/proto/onnx.rs");
    let checked_in = std::fs::read_to_string(&checked_in_path).unwrap_or_default();
    if checked_in == generated {
        return;
    }
    // Regenerating still fails when the content changed, so a run with the variable left
    // set (in CI, say) cannot pass over a drift: the next run, on the rewritten file, passes.
    if std::env::var_os("PEREGRINE_ONNX_REGENERATE").is_some() {
        std::fs::write(&checked_in_path, &generated).expect("write src/proto/onnx.rs");
        panic!("src/proto/onnx.rs was stale and has been rewritten: review and commit it, then run again");
    }
    panic!(
        "src/proto/onnx.rs is stale: regenerate it with \
         PEREGRINE_ONNX_REGENERATE=1 cargo test -p peregrine-onnx --test proto_codegen"
    );
}
