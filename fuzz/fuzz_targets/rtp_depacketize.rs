//! RTP payloads of plain H.264 (RFC 6184) and H.265 (RFC 7798), depacketized into
//! access units; each RFC 4571 frame's first byte picks the marker and a loss before it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    peregrine_video::rtp::fuzzing::rtp_depacketize(data);
});
