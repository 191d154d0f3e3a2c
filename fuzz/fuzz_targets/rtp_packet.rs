//! RTP packets (RFC 3550 headers) as a pushing camera sends them, through the
//! reordering jitter buffer: RFC 4571 frames of the input, one packet each.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    peregrine_video::rtp::fuzzing::rtp_packets(data);
});
