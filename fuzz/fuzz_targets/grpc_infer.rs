//! A gRPC `ModelInferRequest` message, as tonic hands it to the service.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = peregrine_api::fuzzing::grpc_infer_message(data);
});
