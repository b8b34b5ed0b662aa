//! Where the readers put a checkpoint's tensors: a [`TensorSink`] plans each header's tensors and takes
//! each planned tensor's bytes in order, in pieces of any size. The safetensors reader
//! ([`crate::weights::load::load_source`]) and the PyTorch reader ([`crate::weights::torch_load`]) feed
//! any sink: the loader's [`Assembler`] (GPU buffers) or the converter's writer
//! ([`crate::weights::export`], safetensors files). A [`CheckpointSink`] also loads whole files of a
//! source, so [`crate::weights::load::load_checkpoint`] (which files make a checkpoint) serves both.

use crate::error::Result;
use crate::weights::assemble::{Assembler, TensorWriter};
use crate::weights::header::Header;
use crate::weights::names::Layout;
use crate::weights::plan::TensorPlan;

/// Receives planned tensors, one writer per tensor (several may be open at once where tensors share a
/// PyTorch storage).
pub trait TensorSink {
    type Writer;
    /// Plan every tensor of a header (file order); `None` entries are not needed and are skipped.
    fn plan_header(&mut self, file: &str, header: &Header) -> Result<Vec<Option<TensorPlan>>>;
    /// Fix the layout (e.g. from an index's names) before any header is planned.
    fn set_layout(&mut self, layout: Layout);
    /// Open a writer for a planned tensor.
    fn begin(&mut self, plan: TensorPlan) -> Result<Self::Writer>;
    /// The next bytes of the writer's tensor.
    fn push(&mut self, w: &mut Self::Writer, bytes: &[u8]) -> Result<()>;
    /// Every byte of the writer's tensor has arrived.
    fn finish_tensor(&mut self, w: Self::Writer) -> Result<()>;
    /// Host bytes the caller holds (a read chunk, a header buffer), for accounting.
    fn note_held(&mut self, bytes: u64);
    /// Host bytes a writer holds.
    fn writer_held(w: &Self::Writer) -> u64;
    /// The largest range the readers read (or convert) at once.
    fn chunk_bytes(&self) -> usize;
}

impl TensorSink for Assembler {
    type Writer = TensorWriter;
    fn plan_header(&mut self, file: &str, header: &Header) -> Result<Vec<Option<TensorPlan>>> {
        Assembler::plan_header(self, file, header)
    }
    fn set_layout(&mut self, layout: Layout) {
        Assembler::set_layout(self, layout)
    }
    fn begin(&mut self, plan: TensorPlan) -> Result<TensorWriter> {
        Assembler::begin(self, plan)
    }
    fn push(&mut self, w: &mut TensorWriter, bytes: &[u8]) -> Result<()> {
        Assembler::push(self, w, bytes)
    }
    fn finish_tensor(&mut self, w: TensorWriter) -> Result<()> {
        Assembler::finish_tensor(self, w)
    }
    fn note_held(&mut self, bytes: u64) {
        Assembler::note_held(self, bytes)
    }
    fn writer_held(w: &TensorWriter) -> u64 {
        w.host_bytes()
    }
    fn chunk_bytes(&self) -> usize {
        self.options().chunk_bytes
    }
}

/// A [`TensorSink`] that loads whole weights files of a source `S` (by name, as an index names them).
#[allow(async_fn_in_trait)]
pub trait CheckpointSink<S: ?Sized>: TensorSink {
    /// Load the weights file `name` (safetensors, or a PyTorch checkpoint when it ends in `.bin`);
    /// `expect_names`: tensors an index places in it. `Ok(false)` when the file is absent.
    async fn load_file(&mut self, src: &S, name: &str, expect_names: &[&str]) -> Result<bool>;
}
