//! Rewrites a model file, for looking at the result in Netron or checking it with other tools.
//!
//! `cargo run -p peregrine-onnx --example rewrite_file -- IN.onnx OUT.onnx [top_k|none] [keep-input]`

use peregrine_onnx::{rewrite, RewriteOptions, DEFAULT_TOP_K};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output, rest @ ..] = args.as_slice() else {
        return Err("usage: rewrite_file IN.onnx OUT.onnx [top_k|none] [keep-input]".into());
    };
    let top_k = match rest.first().map(String::as_str) {
        None => Some(DEFAULT_TOP_K),
        Some("none") => None,
        Some(k) => Some(k.parse()?),
    };
    let options = RewriteOptions {
        uint8_nhwc_input: rest.get(1).map(String::as_str) != Some("keep-input"),
        top_k,
        fold_dfl_softmax: false,
    };
    let rewritten = rewrite(&std::fs::read(input)?, &options)?;
    std::fs::write(output, &rewritten.model)?;
    println!("{}", rewritten.summary());
    Ok(())
}
