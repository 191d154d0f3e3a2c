//! Frames that stay on the GPU (`--gpu-frames`) against the CPU path, on the GPU machine:
//! every picture of each clip decoded by NVDEC, then letterboxed twice, once as streams do
//! without `--gpu-frames` (copied to the host, converted by swscale, letterboxed on the
//! CPU) and once where it is (`letterbox_nv12` into a device canvas, copied back to
//! compare), value by value. Equal canvases mean equal detections. Also times both ways
//! per picture.
//!
//! ```text
//! cargo build --release --example gpu_frames_parity
//! gpu_frames_parity [--device 0] [--imgsz 640] CLIP...
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use peregrine_backend::cuda::frames::{FrameSlot, GpuFrameLetterboxer};
use peregrine_backend::cuda::{self, CopyKind, DeviceBuffer, Placement, Stream};
use peregrine_video::{
    DecoderConfig, DeviceSurface, FileOpener, Hardware, Opener, Pacing, SystemWallClock, VideoDecoder,
};
use peregrine_vision::{resample_tables, ImageView, Letterbox, LetterboxCanvas};

/// One clip's access units and decoder parameters, read once.
struct Clip {
    units: Vec<(Vec<u8>, i64)>,
    decoder: DecoderConfig,
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
    })
}

#[derive(Default)]
struct Tally {
    pictures: usize,
    kept: usize,
    values: usize,
    differing: usize,
    max_difference: u8,
    first_error: Option<String>,
    cpu: Duration,
    gpu: Duration,
}

/// The GPU side: a letterboxer, a device canvas and a stream to copy it back on.
struct GpuSide {
    letterboxer: GpuFrameLetterboxer,
    canvas: DeviceBuffer,
    stream: Stream,
    imgsz: usize,
}

impl GpuSide {
    fn new(device: i32, imgsz: usize) -> Result<Self, cuda::CudaError> {
        Ok(Self {
            letterboxer: GpuFrameLetterboxer::new(device)?,
            canvas: DeviceBuffer::new(imgsz * imgsz * 3)?,
            stream: cuda::create_stream()?,
            imgsz,
        })
    }

    /// The surface letterboxed into the device canvas, and that canvas copied back.
    fn canvas_of(&mut self, surface: &dyn DeviceSurface) -> Result<Vec<u8>, cuda::CudaError> {
        let image = surface.image();
        let lb = Letterbox::new(image.width, image.height, self.imgsz, self.imgsz);
        let (columns, rows) = resample_tables(image.width, image.height, &lb);
        let slot = FrameSlot {
            image: &image,
            place: Placement {
                slot: 0,
                width: image.width,
                height: image.height,
                scaled: (lb.scaled_width, lb.scaled_height),
                offset: (lb.left, lb.top),
                pad_value: Letterbox::PAD_VALUE,
                columns: &columns,
                rows: &rows,
            },
        };
        // SAFETY: the canvas holds one slot on this device; the surface is alive and done.
        unsafe {
            self.letterboxer
                .letterbox_into(&[slot], self.canvas.ptr().cast(), self.imgsz, self.imgsz)
        }?;
        let mut host = vec![0u8; self.canvas.len()];
        // SAFETY: both hold one canvas; synchronised right after.
        unsafe {
            cuda::copy_async(
                host.as_mut_ptr().cast(),
                self.canvas.ptr(),
                host.len(),
                CopyKind::DeviceToHost,
                &self.stream,
            )
        }?;
        cuda::synchronize(&self.stream)?;
        Ok(host)
    }
}

fn compare(clip: &Clip, device: i32, gpu: &mut GpuSide) -> Result<Tally, String> {
    let hardware = Hardware::Nvdec {
        device,
        required: true,
        held_frames: 2,
    };
    let mut decoder = VideoDecoder::open_on(&clip.decoder, hardware).map_err(|e| e.to_string())?;
    let (mut tally, mut scratch, mut rgb) = (Tally::default(), LetterboxCanvas::new(), Vec::new());
    let imgsz = gpu.imgsz;
    let mut on_picture = |mut pic: peregrine_video::DecodedPicture<'_>| {
        tally.pictures += 1;
        let started = Instant::now();
        let surface = match pic.keep_on_gpu(device) {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                tally.first_error.get_or_insert(e.to_string());
                return;
            }
        };
        let gpu_canvas = match gpu.canvas_of(&surface) {
            Ok(c) => c,
            Err(e) => {
                tally.first_error.get_or_insert(e.to_string());
                return;
            }
        };
        tally.gpu += started.elapsed();
        let started = Instant::now();
        let (w, h) = (pic.width as usize, pic.height as usize);
        // Rows padded as a stream's frames are: swscale's x86 converter works in steps of
        // 8 pixels and leaves the last (width mod 8) unconverted when a row has no room
        // for the whole step.
        let stride = (w * 3).next_multiple_of(64);
        rgb.resize(stride * h, 0);
        if let Err(e) = pic.to_rgb(&mut rgb, stride) {
            tally.first_error.get_or_insert(e.to_string());
            return;
        }
        let mut cpu_canvas = Vec::new();
        let view = ImageView {
            data: &rgb,
            width: w,
            height: h,
            stride,
        };
        scratch.fill_into(view, imgsz, imgsz, &mut cpu_canvas);
        tally.cpu += started.elapsed();
        tally.kept += 1;
        tally.values += cpu_canvas.len();
        for (a, b) in gpu_canvas.iter().zip(&cpu_canvas) {
            if a != b {
                tally.differing += 1;
                tally.max_difference = tally.max_difference.max(a.abs_diff(*b));
            }
        }
    };
    for (data, pts) in &clip.units {
        if let Err(e) = decoder.decode(data, *pts, &mut on_picture) {
            return Err(e.to_string());
        }
    }
    decoder.finish(&mut on_picture).map_err(|e| e.to_string())?;
    Ok(tally)
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();
    let mut args = std::env::args().skip(1);
    let (mut device, mut imgsz, mut clips) = (0i32, 640usize, Vec::new());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--device" => device = args.next().and_then(|v| v.parse().ok()).expect("--device N"),
            "--imgsz" => imgsz = args.next().and_then(|v| v.parse().ok()).expect("--imgsz N"),
            _ => clips.push(PathBuf::from(a)),
        }
    }
    let mut gpu = GpuSide::new(device, imgsz).unwrap_or_else(|e| {
        eprintln!("no GPU letterbox on device {device}: {e}");
        std::process::exit(2);
    });
    println!("| clip | pictures | on the GPU | canvas values equal | max difference | CPU path ms/picture | GPU path ms/picture |");
    println!("|---|---|---|---|---|---|---|");
    let mut failed = false;
    for path in clips {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let clip = match read_clip(path).await {
            Ok(c) => c,
            Err(e) => {
                println!("| {name} | cannot read: {e} | | | | | |");
                failed = true;
                continue;
            }
        };
        match compare(&clip, device, &mut gpu) {
            Ok(t) => {
                let equal = 100.0 * (t.values - t.differing) as f64 / t.values.max(1) as f64;
                let per = |d: Duration| d.as_secs_f64() * 1000.0 / t.kept.max(1) as f64;
                println!(
                    "| {name} | {} | {} | {equal:.4}% ({} of {} differ) | {} | {:.3} | {:.3} |",
                    t.pictures,
                    t.kept,
                    t.differing,
                    t.values,
                    t.max_difference,
                    per(t.cpu),
                    per(t.gpu)
                );
                if let Some(e) = t.first_error {
                    println!("  first error: {e}");
                }
                failed |= t.differing > 0;
            }
            Err(e) => {
                println!("| {name} | failed: {e} | | | | | |");
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}
