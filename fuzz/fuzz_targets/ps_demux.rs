//! An MPEG-PS stream (GB28181 media) in RTP-sized pieces through the demuxer; each
//! RFC 4571 frame's first byte says whether a loss came before it or a frame ends after it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    peregrine_video::rtp::fuzzing::ps_demux(data);
});
