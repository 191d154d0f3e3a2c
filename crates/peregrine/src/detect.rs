//! `peregrine detect`: files in, detections out.
//!
//! A reader thread decodes images while the model runs on the previous batch; the channel
//! between them is bounded, so memory stays at a few decoded images whatever the input.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use peregrine_types::{ClassNames, Detection};
use peregrine_vision::{decode_image, DecodeLimits, DecodedImage, ImageView};

use crate::cli::{DetectArgs, OutputFormat};
use crate::report::{self, ImageReport};
use crate::{inputs, model};
use peregrine_api::DetectionJson;

type Decoded = (PathBuf, Result<DecodedImage>);

fn read_and_decode(path: &Path, limits: DecodeLimits) -> Result<DecodedImage> {
    let bytes = std::fs::read(path).context("cannot read file")?;
    Ok(decode_image(&bytes, limits)?)
}

pub fn run(args: DetectArgs) -> Result<ExitCode> {
    let (paths, problems) = inputs::expand(&args.inputs);
    for p in &problems {
        eprintln!("peregrine: {p}");
    }
    if paths.is_empty() {
        anyhow::bail!("no images to process");
    }
    let batch = args.batch.max(1);
    let mut detector = model::load_detector(&args.model, batch, None)?;
    let names = detector.spec().names.clone();
    let params = model::detect_params(&args.thresholds, &names)?;
    if let Some(dir) = &args.save {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }

    let progress = ProgressBar::new(paths.len() as u64);
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} images, {per_sec}, eta {eta}")
            .expect("the template is valid"),
    );
    if paths.len() < 20 {
        progress.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }

    let limits = DecodeLimits {
        max_pixels: args.max_pixels,
    };
    let (tx, rx) = mpsc::sync_channel::<Decoded>(batch * 2);
    let reader = std::thread::Builder::new()
        .name("decode".into())
        .spawn(move || {
            for path in paths {
                let decoded = read_and_decode(&path, limits);
                if tx.send((path, decoded)).is_err() {
                    break;
                }
            }
        })
        .context("starting the decode thread")?;

    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut failures = problems.len();
    let mut pending: Vec<(PathBuf, DecodedImage)> = Vec::with_capacity(batch);
    let mut rx = rx.into_iter().peekable();
    while let Some((path, decoded)) = rx.next() {
        match decoded {
            Ok(img) => pending.push((path, img)),
            Err(e) => {
                progress.suspend(|| {
                    eprintln!(
                        "peregrine: {}: {}",
                        path.display(),
                        crate::error_chain::one_line(&e)
                    )
                });
                failures += 1;
                progress.inc(1);
            }
        }
        if pending.len() == batch || (rx.peek().is_none() && !pending.is_empty()) {
            let views: Vec<ImageView<'_>> =
                pending.iter().map(|(_, img)| ImageView::from(&img.rgb)).collect();
            let (results, _) = detector.detect(&views, &params).context("running the model")?;
            for ((path, img), dets) in pending.drain(..).zip(results) {
                emit(&mut out, args.format, &path, &img, &dets, &names)?;
                if let Some(dir) = &args.save {
                    if let Err(e) = save_annotated(dir, &path, img, &dets, &names) {
                        progress.suspend(|| {
                            eprintln!(
                                "peregrine: {}: not saved: {}",
                                path.display(),
                                crate::error_chain::one_line(&e)
                            )
                        });
                        failures += 1;
                    }
                }
                progress.inc(1);
            }
            out.flush()?;
        }
    }
    progress.finish_and_clear();
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("the decode thread panicked"))?;
    Ok(if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn emit(
    out: &mut impl Write,
    format: OutputFormat,
    path: &Path,
    img: &DecodedImage,
    dets: &[Detection],
    names: &ClassNames,
) -> Result<()> {
    let shown = path.display().to_string();
    let report = ImageReport {
        image: &shown,
        width: img.width(),
        height: img.height(),
        detections: dets.iter().map(|d| DetectionJson::new(d, names)).collect(),
    };
    match format {
        OutputFormat::Json => report::write_json(out, &report)?,
        OutputFormat::Table => report::write_table(out, &report)?,
    }
    Ok(())
}

/// Writes `<dir>/<file stem>.<jpg|png>`: JPEG for JPEG inputs, PNG for the rest.
fn save_annotated(
    dir: &Path,
    path: &Path,
    img: DecodedImage,
    dets: &[Detection],
    names: &ClassNames,
) -> Result<()> {
    let mut rgb = img.rgb;
    peregrine_vision::annotate::draw_detections(&mut rgb, dets, names);
    let ext = if img.format == image::ImageFormat::Jpeg {
        "jpg"
    } else {
        "png"
    };
    let stem = path
        .file_stem()
        .map_or_else(|| "image".into(), |s| s.to_string_lossy());
    let target = dir.join(format!("{stem}.{ext}"));
    rgb.save(&target)
        .with_context(|| format!("writing {}", target.display()))?;
    Ok(())
}
