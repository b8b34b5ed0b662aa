//! A borrowed row-major matrix, the operand type of the CPU GEMMs ([`crate::cpu::gemm`],
//! [`crate::cpu::packed`]).

use crate::error::{Error, Result};

/// A borrowed row-major matrix: `rows` rows of `cols` values, row r starting at `r * stride`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
}

impl<'a> MatRef<'a> {
    /// A contiguous (rows, cols) matrix.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        MatRef {
            data,
            rows,
            cols,
            stride: cols,
        }
    }

    pub(crate) fn check(&self, op: &'static str, what: &str) -> Result<()> {
        let need = match self.rows {
            0 => 0,
            r => (r - 1) * self.stride + self.cols,
        };
        if self.stride < self.cols || self.data.len() < need {
            return Err(Error::shape(
                op,
                format!(
                    "{what}: {} rows of {} at stride {} do not fit {} values",
                    self.rows,
                    self.cols,
                    self.stride,
                    self.data.len()
                ),
            ));
        }
        Ok(())
    }

    #[inline]
    pub(crate) fn row(&self, r: usize) -> &'a [f32] {
        &self.data[r * self.stride..r * self.stride + self.cols]
    }
}
