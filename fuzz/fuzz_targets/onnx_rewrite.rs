//! A model file from the repository directory, rewritten at load time. The first byte
//! chooses the rewrite (uint8 input or not, top-K or not, DFL fold or not); the rest is the
//! ONNX protobuf.
#![no_main]

use libfuzzer_sys::fuzz_target;
use peregrine_onnx::{rewrite, RewriteOptions};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, model)) = data.split_first() else {
        return;
    };
    let options = RewriteOptions {
        uint8_nhwc_input: mode & 1 != 0,
        top_k: (mode & 2 != 0).then_some(1 + usize::from(mode >> 3)),
        fold_dfl_softmax: mode & 4 != 0,
    };
    if let Ok(rewritten) = rewrite(model, &options) {
        let _ = rewritten.summary();
    }
});
