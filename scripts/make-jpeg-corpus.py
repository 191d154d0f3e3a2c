#!/usr/bin/env python3
"""Writes a corpus of JPEGs for checking GPU decoding against the CPU's (a few hundred files,
generated at test time, never committed):

  - the shared JPEGs as they are, and the shared photos re-encoded with 4:4:4, 4:2:2, 4:2:0 and 4:4:0 chroma at quality 50-95;
  - crops of them down to 100 px a side, at odd sizes;
  - small downscaled copies (upscaled again by the letterbox: where chroma upsampling shows);
  - restart markers, grayscale;
  - progressive and 4:1:1 files, which the server must decode on the CPU;
  - frames of the shared clips at several sizes and qualities.

    scripts/make-jpeg-corpus.py IMAGES_DIR VIDEOS_DIR OUT_DIR

Needs OpenCV's Python package (opencv-python-headless: its libjpeg-turbo encodes every
layout, and its FFmpeg reads the clips). File names say what each file is.
"""
import pathlib
import random
import sys

import cv2

LAYOUTS = {
    "444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
    "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
    "420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
    "440": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440,
    "411": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411,
}


def write(out, name, image, quality=90, layout="420", progressive=False, restart=0):
    params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    if image.ndim == 3:
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, LAYOUTS[layout]]
    if progressive:
        params += [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]
    if restart:
        params += [cv2.IMWRITE_JPEG_RST_INTERVAL, restart]
    ok, data = cv2.imencode(".jpg", image, params)
    if not ok:
        raise SystemExit(f"encoding {name} failed")
    (out / name).write_bytes(data.tobytes())


def photos(images_dir, out, rng):
    count = 0
    for path in sorted(images_dir.iterdir()):
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            continue
        stem = path.stem
        if path.suffix.lower() in (".jpg", ".jpeg"):
            (out / f"{stem}-original.jpg").write_bytes(path.read_bytes())
            count += 1
        h, w = image.shape[:2]
        for layout in ("444", "422", "420", "440"):
            for quality in (50, 75, 95):
                write(out, f"{stem}-s{layout}-q{quality}.jpg", image, quality, layout)
                count += 1
        # Crops down to 100 px a side, odd sizes included, at the usual layouts.
        for cw, ch in ((100, 100), (101, 157), (213, 99), (317, 241)):
            if cw > w or ch > h:
                continue
            x, y = rng.randrange(w - cw + 1), rng.randrange(h - ch + 1)
            layout = rng.choice(("420", "422", "444"))
            write(out, f"{stem}-crop{cw}x{ch}-s{layout}-q85.jpg", image[y : y + ch, x : x + cw], 85, layout)
            count += 1
        # Small copies, which the letterbox upscales.
        for sw in (160, 333):
            sh = max(1, round(h * sw / w))
            small = cv2.resize(image, (sw, sh), interpolation=cv2.INTER_AREA)
            write(out, f"{stem}-small{sw}x{sh}-s420-q90.jpg", small, 90, "420")
            write(out, f"{stem}-small{sw}x{sh}-s422-q70.jpg", small, 70, "422")
            count += 2
        write(out, f"{stem}-rst-s420-q85.jpg", image, 85, "420", restart=3)
        write(out, f"{stem}-rst-s444-q60.jpg", image, 60, "444", restart=1)
        write(out, f"{stem}-gray-q80.jpg", cv2.cvtColor(image, cv2.COLOR_BGR2GRAY), 80)
        # These must stay on the CPU.
        write(out, f"{stem}-prog-s420-q85.jpg", image, 85, "420", progressive=True)
        write(out, f"{stem}-s411-q85.jpg", image, 85, "411")
        count += 5
    return count


def frames(videos_dir, out, rng):
    count = 0
    for path in sorted(videos_dir.glob("*.mp4")):
        capture = cv2.VideoCapture(str(path))
        total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) or 100
        for index in sorted(rng.sample(range(total), min(4, total))):
            capture.set(cv2.CAP_PROP_POS_FRAMES, index)
            ok, frame = capture.read()
            if not ok:
                continue
            h, w = frame.shape[:2]
            for width in (w, 640, 320, 200):
                height = max(1, round(h * width / w))
                scaled = frame if width == w else cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA)
                for quality in (60, 90):
                    write(out, f"{path.stem}-f{index}-{width}x{height}-s420-q{quality}.jpg", scaled, quality, "420")
                    count += 1
        capture.release()
    return count


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    images_dir, videos_dir, out = (pathlib.Path(a) for a in sys.argv[1:])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(15)
    n = photos(images_dir, out, rng)
    m = frames(videos_dir, out, rng)
    if m == 0:
        raise SystemExit(f"no frames read from {videos_dir} (does this OpenCV read mp4?)")
    print(f"corpus: {n} photo variants and {m} video frames in {out}")


if __name__ == "__main__":
    main()
