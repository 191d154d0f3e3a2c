//! The RTSP source against GStreamer's RTSP server: TCP and UDP, H.264 and H.265, frames
//! that decode, and capture times from RTCP sender reports.

mod support;

use std::time::Duration;

use peregrine_video::ClockSource;
use peregrine_video::Opener;
use peregrine_video::VideoDecoder;
use peregrine_video::{RtspOpener, RtspTransport};
use support::{h265_clip, shared_clip, RtspServer};

/// Reads frames for up to `frames` and decodes them; returns (pictures, saw an RTCP clock).
async fn read_and_decode(url: &str, transport: RtspTransport, frames: usize) -> (usize, bool) {
    let opener = RtspOpener::new(url.parse().unwrap(), transport, 1);
    let mut source = tokio::time::timeout(Duration::from_secs(20), opener.open())
        .await
        .expect("connect in time")
        .expect("connect");
    let params = source.parameters().expect("parameters").clone();
    let mut decoder = VideoDecoder::open(&params.decoder).expect("decoder");
    let (mut pictures, mut rtcp) = (0, false);
    let mut on_picture = |_pic: peregrine_video::DecodedPicture<'_>| pictures += 1;
    for _ in 0..frames {
        let f = tokio::time::timeout(Duration::from_secs(20), source.next_frame())
            .await
            .expect("frame in time")
            .expect("frame")
            .expect("live stream does not end");
        rtcp |= f.capture.source == ClockSource::RtcpSenderReport;
        decoder
            .decode(&f.data, f.pts_90k, &mut on_picture)
            .expect("decodes");
    }
    (pictures, rtcp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_and_udp_in_h264_and_h265_decode_and_get_rtcp_clock() {
    let server = RtspServer::start(&[("bikes", shared_clip("bikes.mp4")), ("bikes265", h265_clip())]);
    // 7 s of video at 25 fps: GStreamer sends its first sender report within ~5 s.
    let cases = [
        ("bikes", RtspTransport::Tcp),
        ("bikes", RtspTransport::Udp),
        ("bikes265", RtspTransport::Tcp),
        ("bikes265", RtspTransport::Udp),
    ];
    // Each camera on its own task, as the supervisor would run it.
    let runs = cases.iter().map(|(mount, transport)| {
        let (url, mount, transport) = (server.url(mount), *mount, *transport);
        tokio::spawn(async move { (mount, transport, read_and_decode(&url, transport, 175).await) })
    });
    for run in futures_util::future::join_all(runs).await {
        let (mount, transport, (pictures, rtcp)) = run.expect("camera task");
        eprintln!("{mount} over {transport:?}: {pictures} pictures, rtcp clock: {rtcp}");
        assert!(pictures >= 150, "{mount}/{transport:?}: only {pictures} pictures");
        assert!(
            rtcp,
            "{mount}/{transport:?}: no frame was timed by an RTCP sender report"
        );
    }
}
