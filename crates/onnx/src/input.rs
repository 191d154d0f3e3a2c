//! The input rewrite: the graph takes the letterboxed canvas itself, `uint8 [N, H, W, 3]`
//! interleaved RGB, and normalises it inside, so the host uploads a quarter of the bytes and
//! does no per-pixel work.
//!
//! Added in front of the original nodes:
//!
//! ```text
//! images_u8 ─Transpose(perm 0,3,1,2)─▶ uint8 NCHW ─Cast(float)─▶ ─Mul(1/255 as f32)─▶ images
//!                                      (float16 inputs: ─Cast(float16)─▶ images)
//! ```
//!
//! The last node writes the original input's name, so every original consumer is left as it
//! was. Transposing the bytes before widening moves a quarter of the data a float transpose
//! would. `Mul` by the float32 constant `1/255` (not `Div` by 255) is what
//! `peregrine_vision::normalize::rgb8_to_planar_f32` computes, `f32::from(v) * (1.0 / 255.0)`,
//! so the float tensor is bit-for-bit the CPU path's. A float16 input is normalised in
//! float32 and then rounded once, which is what feeding the CPU path's floats to a float16
//! input would do.

use crate::edit::{attr_int, attr_ints, GraphEdit, Place};
use crate::proto::tensor_proto::DataType;
use crate::proto::GraphProto;
use crate::tensor::{Dim, ElementType, TensorSpec};
use crate::RewriteError;

/// The scale the CPU normaliser multiplies by; computed in f32 as it does.
pub(crate) const SCALE: f32 = 1.0 / 255.0;

/// The graph's one image input that is not also an initializer (pre-IR-4 exports list
/// initializers among the inputs), with its position in `graph.input`.
pub(crate) fn image_input(graph: &GraphProto) -> Result<(usize, TensorSpec), RewriteError> {
    let is_initializer = |name: &Option<String>| graph.initializer.iter().any(|t| &t.name == name);
    let real: Vec<usize> = (0..graph.input.len())
        .filter(|&i| !is_initializer(&graph.input[i].name))
        .collect();
    let [index] = real.as_slice() else {
        return Err(RewriteError::InputCount(real.len()));
    };
    Ok((*index, TensorSpec::from_value_info(&graph.input[*index])?))
}

/// Checks that `spec` is a float `[N, 3, H, W]` image and returns the NHWC uint8 shape.
pub(crate) fn nhwc_dims(spec: &TensorSpec) -> Result<Vec<Dim>, RewriteError> {
    if !matches!(spec.element, ElementType::F32 | ElementType::F16) {
        return Err(RewriteError::InputType {
            name: spec.name.clone(),
            element: spec.element.to_string(),
        });
    }
    let bad_shape = || RewriteError::InputShape {
        name: spec.name.clone(),
        shape: spec.shape_string(),
    };
    let dims = spec.dims.as_deref().ok_or_else(bad_shape)?;
    let [n, c, h, w] = dims else {
        return Err(bad_shape());
    };
    if matches!(c, Dim::Fixed(v) if *v != 3) {
        return Err(bad_shape());
    }
    Ok(vec![n.clone(), h.clone(), w.clone(), Dim::Fixed(3)])
}

/// Replaces the float NCHW input with a uint8 NHWC one named `<original>_u8` and returns the
/// new input's description.
pub(crate) fn rewrite_input(
    graph: &mut GraphProto,
    edit: &mut GraphEdit,
) -> Result<TensorSpec, RewriteError> {
    let (index, original) = image_input(graph)?;
    let dims = nhwc_dims(&original)?;
    let new_input = TensorSpec {
        name: edit.unique(&format!("{}_u8", original.name)),
        element: ElementType::U8,
        dims: Some(dims),
    };

    let nchw = edit.node(
        Place::Front,
        "Transpose",
        "input_nchw_u8",
        &[&new_input.name],
        vec![attr_ints("perm", &[0, 3, 1, 2])],
    );
    let widened = edit.node(
        Place::Front,
        "Cast",
        "input_f32",
        &[&nchw],
        vec![attr_int("to", DataType::Float as i64)],
    );
    let scale = edit.const_f32("inv_255", SCALE);
    match original.element {
        ElementType::F16 => {
            let scaled = edit.node(
                Place::Front,
                "Mul",
                "input_scaled_f32",
                &[&widened, &scale],
                vec![],
            );
            edit.push(
                Place::Front,
                "Cast",
                &[&scaled],
                vec![original.name.clone()],
                vec![attr_int("to", DataType::Float16 as i64)],
            );
        }
        _ => edit.push(
            Place::Front,
            "Mul",
            &[&widened, &scale],
            vec![original.name.clone()],
            vec![],
        ),
    }

    // The original input becomes an internal value; keeping its declaration in value_info
    // keeps its shape visible to shape inference and to anyone reading the graph.
    let old = std::mem::replace(&mut graph.input[index], new_input.to_value_info());
    if !graph.value_info.iter().any(|v| v.name == old.name) {
        graph.value_info.push(old);
    }
    Ok(new_input)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(element: ElementType, dims: Vec<Dim>) -> TensorSpec {
        TensorSpec {
            name: "images".into(),
            element,
            dims: Some(dims),
        }
    }

    #[test]
    fn scale_is_the_cpu_normalisers() {
        // Every byte value maps to the same float as peregrine_vision's normaliser.
        let mut planar = [0f32; 3 * 256];
        let pixels: Vec<u8> = (0..=255u8).flat_map(|v| [v, v, v]).collect();
        peregrine_vision::normalize::rgb8_to_planar_f32(&pixels, &mut planar);
        for v in 0..=255u8 {
            assert_eq!((f32::from(v) * SCALE).to_bits(), planar[v as usize].to_bits());
        }
    }

    #[test]
    fn nchw_float_becomes_nhwc_with_the_same_symbols() {
        use Dim::{Fixed as F, Named as N};
        let dims = nhwc_dims(&spec(
            ElementType::F32,
            vec![N("batch".into()), F(3), N("height".into()), F(640)],
        ))
        .unwrap();
        assert_eq!(dims, [N("batch".into()), N("height".into()), F(640), F(3)]);
    }

    #[test]
    fn non_image_inputs_are_refused_with_what_they_are() {
        use Dim::Fixed as F;
        let err = nhwc_dims(&spec(ElementType::Other(7), vec![F(1), F(3), F(8), F(8)])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "input \"images\" is int64, not a float image tensor"
        );
        let err = nhwc_dims(&spec(ElementType::U8, vec![F(1), F(8), F(8), F(3)])).unwrap_err();
        assert!(err.to_string().contains("is uint8"), "{err}");
        let err = nhwc_dims(&spec(ElementType::F32, vec![F(1), F(4), F(8), F(8)])).unwrap_err();
        assert!(err.to_string().contains("[1, 4, 8, 8]"), "{err}");
    }
}
