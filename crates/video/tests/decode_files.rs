//! The static FFmpeg build decodes every shared clip, H.264 and H.265, to sensible RGB.

use std::path::PathBuf;
use std::time::Instant;

use peregrine_video::Opener;
use peregrine_video::{Codec, VideoDecoder};
use peregrine_video::{FileOpener, Pacing};

fn shared(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/videos")
        .join(name)
}

/// Decodes a whole file as fast as possible; returns (pictures, codec, first picture's mean).
async fn decode_all(path: PathBuf) -> (usize, Codec, f64) {
    let opener = FileOpener {
        path,
        looped: false,
        pacing: Pacing::AsFastAsPossible,
        decode_threads: 2,
        clock: std::sync::Arc::new(peregrine_video::SystemWallClock),
    };
    let mut source = opener.open().await.expect("open");
    let params = source.parameters().expect("file parameters").clone();
    let mut decoder = VideoDecoder::open(&params.decoder).expect("decoder");
    let (mut pictures, mut mean) = (0usize, None);
    let stride = (params.width as usize * 3).div_ceil(64) * 64;
    let mut rgb = vec![0u8; stride * params.height as usize];
    let mut on_picture = |mut pic: peregrine_video::DecodedPicture<'_>| {
        assert_eq!((pic.width, pic.height), (params.width, params.height));
        pictures += 1;
        if mean.is_none() {
            pic.to_rgb(&mut rgb, stride).expect("rgb");
            let row_bytes = pic.width as usize * 3;
            let sum: u64 = rgb
                .chunks(stride)
                .flat_map(|r| &r[..row_bytes])
                .map(|&b| u64::from(b))
                .sum();
            mean = Some(sum as f64 / (row_bytes * pic.height as usize) as f64);
        }
    };
    while let Some(frame) = source.next_frame().await.expect("frame") {
        decoder
            .decode(&frame.data, frame.pts_90k, &mut on_picture)
            .expect("decode");
    }
    decoder.finish(&mut on_picture).expect("flush");
    (pictures, params.decoder.codec, mean.unwrap_or(0.0))
}

#[tokio::test]
async fn decodes_every_shared_clip() {
    for (name, frames) in [
        ("bikes.mp4", 250),
        ("bigbuckbunny.mp4", 132),
        ("street-1080p.mp4", 42),
    ] {
        let started = Instant::now();
        let (n, codec, mean) = decode_all(shared(name)).await;
        eprintln!("{name}: {n} pictures in {:?}, mean {mean:.1}", started.elapsed());
        assert_eq!(codec, Codec::H264);
        assert!((frames - 2..=frames + 2).contains(&n), "{name}: {n} pictures");
        assert!(mean > 10.0 && mean < 245.0, "{name}: implausible mean {mean}");
    }
}

#[tokio::test]
async fn decodes_h265() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/videos/bikes-h265.mp4");
    assert!(
        path.exists(),
        "{} missing: run make setup and scripts/setup-test.sh",
        path.display()
    );
    let (n, codec, mean) = decode_all(path).await;
    assert_eq!(codec, Codec::H265);
    assert!(n >= 248, "{n} pictures");
    assert!(mean > 10.0 && mean < 245.0, "implausible mean {mean}");
}
