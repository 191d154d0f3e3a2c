//! A KServe v2 REST inference body (JSON header, then binary tensors). The first byte
//! chooses the `Inference-Header-Content-Length` header: absent when even, else the next
//! two bytes (little-endian) as its decimal value; the rest is the body.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let _ = peregrine_api::fuzzing::kserve_rest_body(None, rest);
    } else if rest.len() >= 2 {
        let length = u16::from_le_bytes([rest[0], rest[1]]).to_string();
        let _ = peregrine_api::fuzzing::kserve_rest_body(Some(length.as_bytes()), &rest[2..]);
    }
});
