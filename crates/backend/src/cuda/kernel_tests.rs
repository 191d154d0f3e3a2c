//! The kernels without a GPU: NVRTC compiles them, and their source built as C++ for the
//! host computes what the CPU path computes.

use std::path::PathBuf;

use super::*;

/// NVRTC as `scripts/setup-test.sh` installs it (`scripts/fetch-nvrtc.sh`).
fn nvrtc() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/nvrtc/libnvrtc.so.12");
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup-test.sh (or scripts/fetch-nvrtc.sh)",
        path.display()
    );
    path
}

/// Every kernel compiles for Hopper (the lent H100 / H200) and for an older
/// architecture, and each is in the PTX under the name the loader asks for.
#[test]
fn kernels_compile_with_nvrtc_without_a_gpu() {
    for (major, minor) in [(9, 0), (7, 5)] {
        let ptx =
            compile_check(&nvrtc(), major, minor).unwrap_or_else(|e| panic!("compute_{major}{minor}: {e}"));
        let text = String::from_utf8_lossy(&ptx);
        for kernel in [
            "letterbox_bilinear",
            "ycc_to_rgb",
            "nv12_to_rgb",
            "letterbox_nv12",
        ] {
            assert!(
                text.contains(&format!(".entry {kernel}(")),
                "compute_{major}{minor}: no entry {kernel} in the PTX"
            );
        }
    }
}

/// The check reports a compiler error with NVRTC's log, so it can fail.
#[test]
fn a_broken_source_is_reported_with_the_log() {
    let lib = unsafe { libloading::Library::new(nvrtc()) }.unwrap();
    let nvrtc = Nvrtc::from_library(&lib).unwrap();
    let err = compile_source(&nvrtc, "extern \"C\" __global__ void k() { undeclared(); }", 9, 0).unwrap_err();
    assert!(err.0.contains("undeclared"), "{err}");
}

/// The kernels' source compiled as ordinary C++ for this machine and run thread by thread:
/// what a machine without a GPU can check of their arithmetic. CUDA's integer semantics
/// for these operations (32-bit `int`, arithmetic right shifts, truncating casts to
/// `short`) are the host compiler's on x86-64.
mod on_the_host {
    use std::path::Path;
    use std::process::Command;

    use peregrine_vision::yuv::{Nv12Planes, YuvToRgb};
    use peregrine_vision::{resample_tables, ImageView, Letterbox, LetterboxCanvas};

    use super::SOURCE;

    const HARNESS: &str = r#"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
using std::max;
using std::min;
struct Index { int x, y; };
static Index blockIdx, threadIdx, blockDim = {1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
#include "kernels.cu"

static std::vector<unsigned char> load(const char* path) {
    FILE* f = fopen(path, "rb");
    std::vector<unsigned char> data;
    int c;
    while ((c = fgetc(f)) != EOF) data.push_back((unsigned char)c);
    fclose(f);
    return data;
}

// args: dir width height pitch c0..c5 canvas_w canvas_h scaled_w scaled_h left top pad
int main(int argc, char** argv) {
    const char* dir = argv[1];
    int a[15];
    for (int i = 0; i < 15; ++i) a[i] = atoi(argv[i + 2]);
    int w = a[0], h = a[1], pitch = a[2], cw = a[9], ch = a[10], sw = a[11], sh = a[12], left = a[13], top = a[14];
    char path[512];
    snprintf(path, sizeof path, "%s/luma", dir); std::vector<unsigned char> luma = load(path);
    snprintf(path, sizeof path, "%s/chroma", dir); std::vector<unsigned char> chroma = load(path);
    snprintf(path, sizeof path, "%s/tables", dir); std::vector<unsigned char> t = load(path);
    const int* columns = (const int*)t.data();
    const int* rows = columns + 4 * sw;
    std::vector<unsigned char> rgb(w * h * 3), canvas(cw * ch * 3, (unsigned char)114);
    for (int y = 0; y < h; ++y) for (int x = 0; x < w; ++x) {
        blockIdx = {x, y}; threadIdx = {0, 0};
        nv12_to_rgb(luma.data(), pitch, chroma.data(), pitch, w, h, a[3], a[4], a[5], a[6], a[7], a[8], rgb.data(), w * 3);
    }
    unsigned char* dst = canvas.data() + (top * cw + left) * 3;
    for (int y = 0; y < sh; ++y) for (int x = 0; x < sw; ++x) {
        blockIdx = {x, y}; threadIdx = {0, 0};
        letterbox_nv12(luma.data(), pitch, chroma.data(), pitch, a[3], a[4], a[5], a[6], a[7], a[8],
                       columns, rows, sw, sh, dst, cw * 3);
    }
    snprintf(path, sizeof path, "%s/rgb", dir); FILE* f = fopen(path, "wb"); fwrite(rgb.data(), 1, rgb.size(), f); fclose(f);
    snprintf(path, sizeof path, "%s/canvas", dir); f = fopen(path, "wb"); fwrite(canvas.data(), 1, canvas.size(), f); fclose(f);
    return 0;
}
"#;

    fn noise(len: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.wrapping_mul(2_654_435_761) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state >> 24) as u8
            })
            .collect()
    }

    fn build(dir: &Path) -> std::path::PathBuf {
        std::fs::write(dir.join("kernels.cu"), SOURCE).unwrap();
        std::fs::write(dir.join("harness.cpp"), HARNESS).unwrap();
        let exe = dir.join("harness");
        let out = Command::new("c++")
            .args(["-O1", "-x", "c++", "-o"])
            .arg(&exe)
            .arg(dir.join("harness.cpp"))
            .output()
            .expect("a C++ compiler (build-essential, which scripts/setup.sh installs)");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        exe
    }

    /// `nv12_to_rgb` gives `convert_nv12`'s bytes, and `letterbox_nv12` the CPU letterbox's
    /// canvas of those bytes, for downscaled, upscaled and odd-sized pictures, every
    /// colour matrix and range the decoder meets.
    #[test]
    fn nv12_kernels_compute_the_cpu_paths_bytes() {
        let dir = std::env::temp_dir().join(format!("peregrine-nv12-kernels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = build(&dir);
        let cases = [
            (160, 90, 1, false),
            (45, 30, 5, true),
            (20, 36, 9, false),
            (64, 64, 5, false),
        ];
        for (i, (w, h, matrix, full)) in cases.into_iter().enumerate() {
            let conversion = YuvToRgb::new(matrix, full).unwrap();
            let pitch = w + 7 + (w % 2);
            let luma = noise(pitch * h, i as u32 + 1);
            let chroma = noise(pitch * h.div_ceil(2), i as u32 + 50);
            let mut rgb = vec![0u8; w * h * 3];
            let planes = Nv12Planes {
                y: &luma,
                y_stride: pitch,
                uv: &chroma,
                uv_stride: pitch,
            };
            conversion.convert_nv12(planes, w, h, &mut rgb, w * 3);
            let (cw, ch) = (64, 48);
            let mut canvas = Vec::new();
            let view = ImageView::packed(&rgb, w, h).unwrap();
            let lb: Letterbox = LetterboxCanvas::new().fill_into(view, cw, ch, &mut canvas);
            let (columns, rows) = resample_tables(w, h, &lb);
            let tables: Vec<u8> = columns
                .iter()
                .chain(&rows)
                .flat_map(|r| r.iter().flat_map(|v| v.to_le_bytes()))
                .collect();
            std::fs::write(dir.join("luma"), &luma).unwrap();
            std::fs::write(dir.join("chroma"), &chroma).unwrap();
            std::fs::write(dir.join("tables"), &tables).unwrap();
            let c = conversion.kernel_coefficients();
            let args: Vec<String> = [w, h, pitch]
                .iter()
                .map(|v| *v as i64)
                .chain(c.iter().map(|&v| i64::from(v)))
                .chain([cw, ch, lb.scaled_width, lb.scaled_height, lb.left, lb.top].map(|v| v as i64))
                .map(|v| v.to_string())
                .collect();
            let out = Command::new(&exe).arg(&dir).args(&args).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let kernel_rgb = std::fs::read(dir.join("rgb")).unwrap();
            assert!(
                kernel_rgb == rgb,
                "case {i} ({w}x{h}): nv12_to_rgb differs from convert_nv12"
            );
            let kernel_canvas = std::fs::read(dir.join("canvas")).unwrap();
            let differ = kernel_canvas.iter().zip(&canvas).filter(|(a, b)| a != b).count();
            assert_eq!(
                differ, 0,
                "case {i} ({w}x{h}): letterbox_nv12 differs in {differ} values"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
