//! NVDEC against FFmpeg's software decoder: every picture of each clip decoded both ways
//! and converted to RGB exactly as streams do, compared value by value, and each way's
//! decoding speed and CPU time. Equal RGB means equal detections (the same model sees the
//! same canvas), so this is the decoder half of the detection parity.
//!
//! ```text
//! cargo run --release --example decoder_parity -- [--device 0] [--parallel 8] CLIP...
//! ```
//!
//! `--parallel N` also decodes each clip N times at once on each decoder (as N streams do)
//! and gives the frames per second and CPU cores used. On a machine without NVDEC the
//! NVDEC column says why and the comparison is skipped.

#[path = "common/cpu_time.rs"]
mod cpu_time;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use peregrine_video::{DecoderConfig, FileOpener, Hardware, Opener, Pacing, SystemWallClock, VideoDecoder};

/// One clip's access units and decoder parameters, read once.
struct Clip {
    units: Vec<(Vec<u8>, i64)>,
    decoder: DecoderConfig,
    width: u32,
    height: u32,
}

async fn read_clip(path: PathBuf) -> Result<Clip, String> {
    let opener = FileOpener {
        path,
        looped: false,
        pacing: Pacing::AsFastAsPossible,
        decode_threads: 2,
        clock: Arc::new(SystemWallClock),
    };
    let mut source = opener.open().await.map_err(|e| e.to_string())?;
    let params = source.parameters().ok_or("no parameters")?.clone();
    let mut units = Vec::new();
    while let Some(frame) = source.next_frame().await.map_err(|e| e.to_string())? {
        units.push((frame.data.to_vec(), frame.pts_90k));
    }
    Ok(Clip {
        units,
        decoder: params.decoder,
        width: params.width,
        height: params.height,
    })
}

/// Decodes the clip; `keep` stores every picture's RGB (rows packed, padding left out).
fn decode(clip: &Clip, hardware: Hardware, keep: bool) -> Result<(Vec<Vec<u8>>, usize, String), String> {
    let mut decoder = VideoDecoder::open_on(&clip.decoder, hardware).map_err(|e| e.to_string())?;
    let mut rgb = Vec::new();
    let (mut pictures, mut count, mut error) = (Vec::new(), 0usize, None);
    let mut on_picture = |mut pic: peregrine_video::DecodedPicture<'_>| {
        count += 1;
        if keep || count % 5 == 0 {
            // Streams convert only sampled pictures; converting one in five when not
            // comparing prices the download and conversion too.
            // Rows padded as a stream's frames are: with rows of exactly `width * 3` bytes,
            // swscale's x86 converter (steps of 8 pixels) leaves the last (width mod 8)
            // pixels of each row unconverted, on both sides of the comparison alike.
            let row = pic.width as usize * 3;
            let stride = row.next_multiple_of(64);
            rgb.resize(stride * pic.height as usize, 0);
            if let Err(e) = pic.to_rgb(&mut rgb, stride) {
                error.get_or_insert(e.to_string());
            }
            if keep {
                pictures.push(
                    rgb.chunks_exact(stride)
                        .flat_map(|r| &r[..row])
                        .copied()
                        .collect(),
                );
            }
        }
    };
    let mut decode_error = None;
    for (data, pts) in &clip.units {
        if let Err(e) = decoder.decode(data, *pts, &mut on_picture) {
            decode_error.get_or_insert(e.to_string());
        }
    }
    decoder.finish(&mut on_picture).map_err(|e| e.to_string())?;
    let error = error.or(decode_error);
    let outcome = match decoder.hardware_outcome() {
        None => "cpu".to_string(),
        Some(o) => format!("{o:?}"),
    };
    match error {
        Some(e) => Err(format!("{outcome}: {e}")),
        None => Ok((pictures, count, outcome)),
    }
}

/// `parallel` decodes of the clip at once: (frames per second, CPU cores).
fn throughput(clip: &Arc<Clip>, hardware: Hardware, parallel: usize) -> Result<(f64, f64), String> {
    let (started, cpu) = (Instant::now(), cpu_time::cpu_seconds());
    let threads: Vec<_> = (0..parallel)
        .map(|_| {
            let clip = clip.clone();
            std::thread::spawn(move || decode(&clip, hardware, false).map(|(_, n, _)| n))
        })
        .collect();
    let mut frames = 0;
    for t in threads {
        frames += t.join().map_err(|_| "a decode thread panicked")??;
    }
    let secs = started.elapsed().as_secs_f64();
    Ok((frames as f64 / secs, (cpu_time::cpu_seconds() - cpu) / secs))
}

#[tokio::main]
async fn main() {
    // FFmpeg's lines come through `tracing` (an NVDEC refusal, a damaged picture): show
    // its warnings and errors on stderr, as the scripts keep stderr as the run's log.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();
    let mut args = std::env::args().skip(1).peekable();
    let (mut device, mut parallel, mut clips) = (0i32, 0usize, Vec::new());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--device" => device = args.next().and_then(|v| v.parse().ok()).expect("--device N"),
            "--parallel" => parallel = args.next().and_then(|v| v.parse().ok()).expect("--parallel N"),
            _ => clips.push(PathBuf::from(a)),
        }
    }
    let nvdec = Hardware::Nvdec {
        device,
        required: false,
        held_frames: 0,
    };
    println!(
        "| clip | size | pictures | NVDEC took it | RGB values equal | pictures equal | max difference |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut speed_rows = Vec::new();
    for path in clips {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let clip = match read_clip(path).await {
            Ok(c) => Arc::new(c),
            Err(e) => {
                println!("| {name} | cannot read: {e} | | | | | |");
                continue;
            }
        };
        let size = format!("{}x{} {:?}", clip.width, clip.height, clip.decoder.codec);
        let cpu = decode(&clip, Hardware::Cpu, true);
        let gpu = decode(&clip, nvdec, true);
        match (cpu, gpu) {
            (Ok((a, _, _)), Ok((b, _, outcome))) => {
                let (mut equal, mut total, mut max, mut same_pictures) = (0u64, 0u64, 0u8, 0usize);
                for (x, y) in a.iter().zip(&b) {
                    let diff = x.iter().zip(y).filter(|(p, q)| p != q).count() as u64;
                    equal += x.len() as u64 - diff;
                    total += x.len() as u64;
                    same_pictures += usize::from(diff == 0);
                    max = max.max(x.iter().zip(y).map(|(p, q)| p.abs_diff(*q)).max().unwrap_or(0));
                }
                println!(
                    "| {name} | {size} | {} / {} | {outcome} | {:.4}% | {same_pictures} / {} | {max} |",
                    a.len(),
                    b.len(),
                    100.0 * equal as f64 / total.max(1) as f64,
                    a.len().min(b.len())
                );
            }
            (cpu, gpu) => println!(
                "| {name} | {size} | cpu: {} | nvdec: {} | | | |",
                cpu.map(|r| r.1.to_string()).unwrap_or_else(|e| e),
                gpu.map(|r| r.2).unwrap_or_else(|e| e)
            ),
        }
        if parallel > 0 {
            let mut row = format!("| {name} | {parallel} |");
            for hardware in [Hardware::Cpu, nvdec] {
                match throughput(&clip, hardware, parallel) {
                    Ok((fps, cores)) => row += &format!(" {fps:.0} | {cores:.2} ({:.4}) |", cores / fps),
                    Err(e) => row += &format!(" {e} | |"),
                }
            }
            speed_rows.push(row);
        }
    }
    if !speed_rows.is_empty() {
        println!("\n| clip | decodes at once | CPU: frames/s | CPU cores (core-s per frame) | NVDEC: frames/s | CPU cores (core-s per frame) |");
        println!("|---|---|---|---|---|---|");
        for r in speed_rows {
            println!("{r}");
        }
    }
}
