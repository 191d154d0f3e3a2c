//! How far the GPU's canvases are from the CPU's, stage by stage, over a corpus:
//!
//! 1. the IDCT: nvJPEG's Y/Cb/Cr planes against libjpeg-turbo's (`tj3DecompressToYUV8`);
//! 2. the kernels: the GPU canvas against the CPU's arithmetic (`jpeg_planes::planes_to_rgb`
//!    and `LetterboxCanvas`) run on nvJPEG's own planes, which must agree exactly;
//! 3. the result: the GPU canvas against the CPU path's (libjpeg-turbo's RGB, letterboxed),
//!    with nvJPEG's own colour conversion (as before 2026-12-01) and with libjpeg-turbo's.
//!
//! JPEGs the server would not send to the GPU (`baseline_jpeg`: progressive, 4:1:1...) are
//! counted and named, not decoded there.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use peregrine_backend::cuda::jpeg::{ColourConversion, GpuJpegDecoder};
use peregrine_vision::jpeg_planes::{
    planes_to_rgb, ChromaSubsampling, DecodedPlanes, Plane, YccPlanes, YccToRgb,
};
use peregrine_vision::{baseline_jpeg, decode_image, DecodeLimits, ImageView, LetterboxCanvas};

/// Differences between two byte sequences of the same length, accumulated.
#[derive(Debug, Default, Clone, Copy)]
struct Diffs {
    values: u64,
    equal: u64,
    within_one: u64,
    sum: u64,
    max: u8,
}

impl Diffs {
    fn of(a: &[u8], b: &[u8]) -> Self {
        let mut d = Self::default();
        for (x, y) in a.iter().zip(b) {
            let diff = x.abs_diff(*y);
            d.values += 1;
            d.equal += u64::from(diff == 0);
            d.within_one += u64::from(diff <= 1);
            d.sum += u64::from(diff);
            d.max = d.max.max(diff);
        }
        // A length mismatch counts every missing value as a full difference.
        let missing = a.len().abs_diff(b.len()) as u64;
        d.values += missing;
        d.sum += missing * 255;
        if missing > 0 {
            d.max = 255;
        }
        d
    }

    fn add(&mut self, o: Self) {
        self.values += o.values;
        self.equal += o.equal;
        self.within_one += o.within_one;
        self.sum += o.sum;
        self.max = self.max.max(o.max);
    }

    fn percent(part: u64, whole: u64) -> f64 {
        100.0 * part as f64 / whole.max(1) as f64
    }

    fn within_one_percent(&self) -> f64 {
        Self::percent(self.within_one, self.values)
    }

    fn summary(&self) -> String {
        format!(
            "within 1 level {:.3}%, equal {:.3}%, mean |diff| {:.4}, max {} ({} values)",
            self.within_one_percent(),
            Self::percent(self.equal, self.values),
            self.sum as f64 / self.values.max(1) as f64,
            self.max,
            self.values
        )
    }
}

fn layout_name(s: ChromaSubsampling) -> &'static str {
    match s {
        ChromaSubsampling::Gray => "gray",
        ChromaSubsampling::None => "4:4:4",
        ChromaSubsampling::Half => "4:2:2",
        ChromaSubsampling::Quarter => "4:2:0",
        ChromaSubsampling::HalfRows => "4:4:0",
    }
}

/// One JPEG the GPU takes, with what the CPU makes of it.
struct Reference {
    name: String,
    bytes: Vec<u8>,
    planes: DecodedPlanes,
    canvas: Vec<u8>,
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name()
        .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into())
}

/// The CPU's side of every JPEG the GPU path takes; prints which it does not.
fn references(files: &[(PathBuf, Vec<u8>)], imgsz: usize) -> Result<Vec<Reference>> {
    let mut refs = Vec::new();
    let mut cpu_only = Vec::new();
    let mut scratch = LetterboxCanvas::new();
    for (path, bytes) in files {
        let name = file_name(path);
        match baseline_jpeg(bytes, DecodeLimits::default()) {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                cpu_only.push(name);
                continue;
            }
        }
        let planes = DecodedPlanes::decode_with_libjpeg_turbo(bytes)
            .with_context(|| format!("{name}: libjpeg-turbo's planes"))?
            .with_context(|| format!("{name}: a baseline JPEG of a layout libjpeg-turbo does not name"))?;
        let img = decode_image(bytes, DecodeLimits::default()).with_context(|| format!("decoding {name}"))?;
        let mut canvas = Vec::new();
        scratch.fill_into(ImageView::from(&img.rgb), imgsz, imgsz, &mut canvas);
        refs.push(Reference {
            name,
            bytes: bytes.clone(),
            planes,
            canvas,
        });
    }
    println!(
        "corpus: {} files, {} decoded on the GPU, {} left to the CPU by the header check{}",
        files.len(),
        refs.len(),
        cpu_only.len(),
        if cpu_only.is_empty() {
            String::new()
        } else {
            format!(": {}", cpu_only.join(" "))
        }
    );
    Ok(refs)
}

fn luma_row<'a>(p: &YccPlanes<'a>, row: usize) -> &'a [u8] {
    &p.y[row * p.y_pitch..row * p.y_pitch + p.width]
}

fn chroma_row<'a>(p: Plane<'a>, row: usize) -> &'a [u8] {
    &p.data[row * p.pitch..row * p.pitch + p.width]
}

/// The IDCT's output: nvJPEG's planes against libjpeg-turbo's, row by row (the pitches
/// differ).
fn compare_planes(nv: &DecodedPlanes, cpu: &DecodedPlanes, luma: &mut Diffs, chroma: &mut Diffs) {
    let (ours, theirs) = (nv.view(), cpu.view());
    for row in 0..ours.height {
        luma.add(Diffs::of(luma_row(&ours, row), luma_row(&theirs, row)));
    }
    if ours.subsampling == ChromaSubsampling::Gray {
        return;
    }
    for row in 0..ours.cb.height {
        for (a, b) in [(ours.cb, theirs.cb), (ours.cr, theirs.cr)] {
            chroma.add(Diffs::of(chroma_row(a, row), chroma_row(b, row)));
        }
    }
}

/// `refs` in batches of `batch` that decode on the GPU: a batch that fails is split into
/// single images, and those that still fail are named in `failed` and left out.
fn decodable_chunks<'a>(
    decoder: &mut GpuJpegDecoder,
    refs: &'a [Reference],
    batch: usize,
    imgsz: usize,
    failed: &mut Vec<String>,
) -> Vec<Vec<&'a Reference>> {
    let mut chunks = Vec::new();
    for chunk in refs.chunks(batch.max(1)) {
        let bytes: Vec<Vec<u8>> = chunk.iter().map(|r| r.bytes.clone()).collect();
        if super::gpu::canvases(decoder, &bytes, imgsz).is_ok() {
            chunks.push(chunk.iter().collect());
            continue;
        }
        for r in chunk {
            match super::gpu::canvases(decoder, std::slice::from_ref(&r.bytes), imgsz) {
                Ok(_) => chunks.push(vec![r]),
                Err(e) => failed.push(format!("{} ({e})", r.name)),
            }
        }
    }
    chunks
}

/// Canvas differences for one colour conversion, over the corpus and per layout; for
/// libjpeg-turbo's, also the IDCT's and the kernels' own.
fn measure(
    refs: &[Reference],
    conversion: ColourConversion,
    imgsz: usize,
    device: i32,
    batch: usize,
) -> Result<()> {
    let mut decoder = GpuJpegDecoder::with_conversion(device, conversion)?;
    let slot_bytes = imgsz * imgsz * 3;
    let (mut total, mut luma, mut chroma, mut kernel) = (
        Diffs::default(),
        Diffs::default(),
        Diffs::default(),
        Diffs::default(),
    );
    let mut by_layout: BTreeMap<&str, Diffs> = BTreeMap::new();
    let mut per_image: Vec<(f64, u8, &str)> = Vec::new();
    let colour = YccToRgb::new();
    let mut scratch = LetterboxCanvas::new();
    let mut failed = Vec::new();
    let chunks = decodable_chunks(&mut decoder, refs, batch, imgsz, &mut failed);
    for chunk in chunks {
        let bytes: Vec<Vec<u8>> = chunk.iter().map(|r| r.bytes.clone()).collect();
        let gpu = super::gpu::canvases(&mut decoder, &bytes, imgsz)?;
        let planes = match conversion {
            ColourConversion::LibjpegTurbo => {
                let views: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
                decoder.decode_to_host(&views)?
            }
            ColourConversion::Nvjpeg => Vec::new(),
        };
        for (i, r) in chunk.iter().enumerate() {
            let canvas = &gpu[i * slot_bytes..(i + 1) * slot_bytes];
            let d = Diffs::of(canvas, &r.canvas);
            total.add(d);
            by_layout
                .entry(layout_name(r.planes.subsampling))
                .or_default()
                .add(d);
            per_image.push((d.within_one_percent(), d.max, &r.name));
            let Some(nv) = planes.get(i) else { continue };
            compare_planes(nv, &r.planes, &mut luma, &mut chroma);
            // The kernels: our CPU arithmetic on nvJPEG's planes must give the GPU canvas.
            let mut rgb = Vec::new();
            planes_to_rgb(&nv.view(), &colour, &mut rgb);
            let view = ImageView::packed(&rgb, nv.width, nv.height).context("converted planes")?;
            let mut expected = Vec::new();
            scratch.fill_into(view, imgsz, imgsz, &mut expected);
            kernel.add(Diffs::of(canvas, &expected));
        }
    }
    let label = match conversion {
        ColourConversion::Nvjpeg => "nvJPEG's colour conversion (RGBI output)",
        ColourConversion::LibjpegTurbo => {
            "libjpeg-turbo's upsampling and colour tables (YUV output + kernel)"
        }
    };
    println!("GPU canvas vs CPU canvas, {label}: {}", total.summary());
    if !failed.is_empty() {
        println!(
            "  GPU decode failed (the server decodes these on the CPU): {}",
            failed.join("; ")
        );
    }
    for (layout, d) in &by_layout {
        println!("  {layout:>6}: {}", d.summary());
    }
    per_image.sort_by(|a, b| a.0.total_cmp(&b.0));
    let worst: Vec<String> = per_image
        .iter()
        .take(8)
        .map(|(p, max, name)| format!("{name} {p:.2}% (max {max})"))
        .collect();
    println!("  worst images: {}", worst.join(", "));
    if conversion == ColourConversion::LibjpegTurbo {
        println!(
            "  IDCT, nvJPEG's planes vs libjpeg-turbo's: luma {}",
            luma.summary()
        );
        println!(
            "  IDCT, nvJPEG's planes vs libjpeg-turbo's: chroma {}",
            chroma.summary()
        );
        println!(
            "  kernels vs the CPU's arithmetic on nvJPEG's planes: {} of {} values differ (max {})",
            kernel.values - kernel.equal,
            kernel.values,
            kernel.max
        );
    }
    Ok(())
}

/// Prints the corpus figures, `batch` images per GPU decode call.
pub fn report(files: &[(PathBuf, Vec<u8>)], imgsz: usize, device: i32, batch: usize) -> Result<()> {
    let decoder = GpuJpegDecoder::new(device)?;
    println!(
        "GPU JPEG decoder: {}",
        if decoder.is_hardware() {
            "hardware"
        } else {
            "CUDA (no hardware decoder)"
        }
    );
    drop(decoder);
    let refs = references(files, imgsz)?;
    for conversion in [ColourConversion::Nvjpeg, ColourConversion::LibjpegTurbo] {
        measure(&refs, conversion, imgsz, device, batch)?;
    }
    Ok(())
}
