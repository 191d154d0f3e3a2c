// Peregrine's image kernels, compiled by NVRTC at run time (crates/backend/src/cuda/kernel.rs
// loads them). Integer arithmetic only, each kernel the GPU twin of a CPU reference in
// peregrine_vision, so canvases made here equal the CPU path's byte for byte; the tests
// compile this file with NVRTC and also as C++ for the host (kernel_tests.rs).

// libjpeg-turbo's upsampled chroma sample for full-resolution pixel (x, y) of a plane of
// w x h samples (jdsample.c: h2v1, h1v2 and h2v2 fancy upsampling; replication where the
// plane has at most 2 columns and the upsampling is horizontal).
__device__ __forceinline__ int upsampled(const unsigned char* p, int pitch, int w, int h,
                                         int layout, int x, int y)
{
    int hf = (layout == 2 || layout == 3) ? 2 : 1;
    int vf = (layout == 3 || layout == 4) ? 2 : 1;
    int cx = x / hf, cy = y / vf;
    bool fancy = w > 2;
    int nx = (x & 1) ? min(cx + 1, w - 1) : max(cx - 1, 0);
    int ny = (y & 1) ? min(cy + 1, h - 1) : max(cy - 1, 0);
    const unsigned char* row = p + (size_t)cy * pitch;
    const unsigned char* other = p + (size_t)ny * pitch;
    switch (layout) {
    case 2:
        if (!fancy) return row[cx];
        return (3 * row[cx] + row[nx] + ((x & 1) ? 2 : 1)) >> 2;
    case 4:
        return (3 * row[cx] + other[cx] + ((y & 1) ? 2 : 1)) >> 2;
    case 3: {
        if (!fancy) return row[cx];
        int near_sum = 3 * row[cx] + other[cx];
        int far_sum = 3 * row[nx] + other[nx];
        return (3 * near_sum + far_sum + ((x & 1) ? 7 : 8)) >> 4;
    }
    default:
        return row[x];
    }
}

// Tables: Cr->R, Cb->B, Cr->G, Cb->G (256 each), jdcolor.c's build_ycc_rgb_table.
extern "C" __global__ void ycc_to_rgb(
    const unsigned char* luma, int luma_pitch,
    const unsigned char* cb, const unsigned char* cr, int chroma_pitch, int chroma_w, int chroma_h,
    int layout, const int* tables, int width, int height,
    unsigned char* dst, int dst_pitch)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    int l = luma[(size_t)y * luma_pitch + x];
    unsigned char* o = dst + (size_t)y * dst_pitch + 3 * x;
    if (layout == 0) {
        o[0] = o[1] = o[2] = (unsigned char)l;
        return;
    }
    int b = upsampled(cb, chroma_pitch, chroma_w, chroma_h, layout, x, y);
    int r = upsampled(cr, chroma_pitch, chroma_w, chroma_h, layout, x, y);
    int red = l + tables[r];
    int green = l + ((tables[768 + b] + tables[512 + r]) >> 16);
    int blue = l + tables[256 + b];
    o[0] = (unsigned char)min(max(red, 0), 255);
    o[1] = (unsigned char)min(max(green, 0), 255);
    o[2] = (unsigned char)min(max(blue, 0), 255);
}

// FFmpeg's x86 YUV 4:2:0 to RGB24 arithmetic (peregrine_vision::yuv::YuvToRgb::rgb, and
// convert_nv12 for the layout): 16-bit lanes, saturating adds, mulhi = (a * b) >> 16.
__device__ __forceinline__ int sat16(int v) { return min(max(v, -32768), 32767); }
__device__ __forceinline__ int mulhi16(int a, int b) { return (a * b) >> 16; }
__device__ __forceinline__ unsigned char pack8(int v) { return (unsigned char)min(max(v, 0), 255); }

// Pixel (x, y) of an NV12 picture (a luma plane, a plane of interleaved U,V pairs) as RGB.
// c: y_offset, y_coeff, vr_coeff, ub_coeff, ug_coeff, vg_coeff (YuvToRgb::kernel_coefficients).
struct Nv12 {
    const unsigned char* luma; int luma_pitch;
    const unsigned char* chroma; int chroma_pitch;
    int c[6];
};

__device__ __forceinline__ void nv12_pixel(const Nv12& p, int x, int y, int* rgb)
{
    const unsigned char* pair = p.chroma + (size_t)(y / 2) * p.chroma_pitch + (x / 2) * 2;
    int yy = (short)((p.luma[(size_t)y * p.luma_pitch + x] << 3) - p.c[0]);
    int u = sat16((pair[0] << 3) - 1024);
    int v = sat16((pair[1] << 3) - 1024);
    int l = mulhi16(yy, p.c[1]);
    int green = sat16(mulhi16(u, p.c[4]) + mulhi16(v, p.c[5]));
    rgb[0] = pack8(sat16(l + mulhi16(v, p.c[2])));
    rgb[1] = pack8(sat16(l + green));
    rgb[2] = pack8(sat16(l + mulhi16(u, p.c[3])));
}

__device__ __forceinline__ Nv12 nv12(const unsigned char* luma, int luma_pitch,
    const unsigned char* chroma, int chroma_pitch, int c0, int c1, int c2, int c3, int c4, int c5)
{
    Nv12 p = {luma, luma_pitch, chroma, chroma_pitch, {c0, c1, c2, c3, c4, c5}};
    return p;
}

// The whole picture to interleaved RGB (a frame placed on its canvas at its own size).
extern "C" __global__ void nv12_to_rgb(
    const unsigned char* luma, int luma_pitch, const unsigned char* chroma, int chroma_pitch,
    int width, int height, int c0, int c1, int c2, int c3, int c4, int c5,
    unsigned char* dst, int dst_pitch)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    Nv12 p = nv12(luma, luma_pitch, chroma, chroma_pitch, c0, c1, c2, c3, c4, c5);
    int rgb[3];
    nv12_pixel(p, x, y, rgb);
    unsigned char* o = dst + (size_t)y * dst_pitch + 3 * x;
    o[0] = (unsigned char)rgb[0];
    o[1] = (unsigned char)rgb[1];
    o[2] = (unsigned char)rgb[2];
}

// letterbox_bilinear reading an NV12 picture: each of the four taps converted as
// nv12_to_rgb would have converted it, so the output is converting then resampling, byte
// for byte, without the full-size RGB in between. The column table's byte offsets are into
// an RGB row (3 per pixel).
extern "C" __global__ void letterbox_nv12(
    const unsigned char* luma, int luma_pitch, const unsigned char* chroma, int chroma_pitch,
    int c0, int c1, int c2, int c3, int c4, int c5,
    const int* columns, const int* rows, int scaled_w, int scaled_h,
    unsigned char* dst, int dst_pitch)
{
    int dx = blockIdx.x * blockDim.x + threadIdx.x;
    int dy = blockIdx.y * blockDim.y + threadIdx.y;
    if (dx >= scaled_w || dy >= scaled_h) return;
    Nv12 p = nv12(luma, luma_pitch, chroma, chroma_pitch, c0, c1, c2, c3, c4, c5);
    const int* x = columns + 4 * dx;
    const int* y = rows + 4 * dy;
    int a0[3], a1[3], b0[3], b1[3];
    nv12_pixel(p, x[0] / 3, y[0], a0);
    nv12_pixel(p, x[1] / 3, y[0], a1);
    nv12_pixel(p, x[0] / 3, y[1], b0);
    nv12_pixel(p, x[1] / 3, y[1], b1);
    unsigned char* o = dst + (size_t)dy * dst_pitch + 3 * dx;
    for (int c = 0; c < 3; ++c) {
        short a = (short)((a0[c] * x[2] + a1[c] * x[3]) >> 4);
        short b = (short)((b0[c] * x[2] + b1[c] * x[3]) >> 4);
        int v = ((((int)a * y[2]) >> 16) + (((int)b * y[3]) >> 16) + 2) >> 2;
        o[c] = (unsigned char)min(max(v, 0), 255);
    }
}

extern "C" __global__ void letterbox_bilinear(
    const unsigned char* src, int src_pitch,
    const int* columns, const int* rows, int scaled_w, int scaled_h,
    unsigned char* dst, int dst_pitch)
{
    int dx = blockIdx.x * blockDim.x + threadIdx.x;
    int dy = blockIdx.y * blockDim.y + threadIdx.y;
    if (dx >= scaled_w || dy >= scaled_h) return;
    const int* x = columns + 4 * dx;
    const int* y = rows + 4 * dy;
    const unsigned char* r0 = src + (size_t)y[0] * src_pitch;
    const unsigned char* r1 = src + (size_t)y[1] * src_pitch;
    unsigned char* o = dst + (size_t)dy * dst_pitch + 3 * dx;
    for (int c = 0; c < 3; ++c) {
        short a = (short)(((int)r0[x[0] + c] * x[2] + (int)r0[x[1] + c] * x[3]) >> 4);
        short b = (short)(((int)r1[x[0] + c] * x[2] + (int)r1[x[1] + c] * x[3]) >> 4);
        int v = ((((int)a * y[2]) >> 16) + (((int)b * y[3]) >> 16) + 2) >> 2;
        o[c] = (unsigned char)min(max(v, 0), 255);
    }
}
