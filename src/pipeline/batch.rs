//! Continuous batching of the decode stage: many prepared tasks ([`Pipeline::prepare`]) decode together,
//! one decoder step for all of them per submit ([`crate::model::bart::Decoder::step_batch`]); tasks join
//! between steps ([`DecodeBatch::add`]) and leave when they finish or are cancelled. Each task keeps its
//! own KV caches, greedy or beam search. Its answer equals, token for token and bit for bit in its
//! logits, the answer it gets alone ([`Pipeline::run_prompt`]): the jobs are the same
//! ([`crate::model::generate::DecodeJob`]) and a batched step's rows do not depend on each other.
//!
//! A batched step is recorded once per set of tasks and replayed while the same tasks step together
//! (its kernels read each task's tokens and position from the task's buffers); a task that joins or
//! leaves makes the next step record anew.

use crate::error::Result;
use crate::gpu::{Plan, Recorder};
use crate::model::bart::{BatchScratch, DecoderState};
use crate::model::generate::{Begin, DecodeJob};
use crate::pipeline::clock::Stopwatch;
use crate::pipeline::observe::{Callbacks, Pieces};
use crate::pipeline::output::TaskOutput;
use crate::pipeline::run::{Prepared, TaskMeta};
use crate::pipeline::Pipeline;

/// What one [`DecodeBatch::step`] did for a task, by the tag it was added with.
#[derive(Debug)]
pub enum BatchEvent<T> {
    /// Tokens that became final (greedy: each step's; beam search: the whole answer at its end), with
    /// the text each adds (see [`Callbacks::on_token`]).
    Tokens(T, Vec<(String, u32)>),
    /// The task ended: its answer, or why there is none. It has left the batch.
    Done(T, Box<Result<TaskOutput>>),
}

struct Entry<'p, T> {
    tag: T,
    job: DecodeJob<'p>,
    meta: TaskMeta,
    pieces: Pieces,
    clock: Stopwatch,
}

/// Tasks decoding together on one pipeline. `T` tags each task (a request id).
pub struct DecodeBatch<'p, T> {
    pipeline: &'p Pipeline,
    entries: Vec<Entry<'p, T>>,
    scratch: Option<BatchScratch>,
    /// Rows (beams) of the largest step so far.
    peak_rows: usize,
    /// The recorded batched step and the states it steps ([`DecoderState::id`], in order).
    step_plan: Option<(Vec<u64>, Plan)>,
    /// Batched steps run, and of those the ones recorded anew (not replayed).
    batched_steps: usize,
    recorded_steps: usize,
}

impl<'p, T: Copy> DecodeBatch<'p, T> {
    pub fn new(pipeline: &'p Pipeline) -> Self {
        DecodeBatch {
            pipeline,
            entries: Vec::new(),
            scratch: None,
            peak_rows: 0,
            step_plan: None,
            batched_steps: 0,
            recorded_steps: 0,
        }
    }

    /// Tasks in the batch.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Steps that ran several tasks' decoder rows together, and how many of them were recorded anew
    /// rather than replayed (the CPU backend records every step: it runs what it records).
    pub fn batched_steps(&self) -> (usize, usize) {
        (self.batched_steps, self.recorded_steps)
    }

    /// Decoder rows (beams) of every task in the batch.
    pub fn rows(&self) -> usize {
        self.entries.iter().map(|e| e.job.rows()).sum()
    }

    /// Add a prepared task; its caches are allocated now (an out-of-memory error is this task's only).
    pub fn add(&mut self, tag: T, prepared: Prepared) -> Result<()> {
        let Prepared { meta, cross } = prepared;
        let model = self.pipeline.model();
        let job = DecodeJob::new(&model.decoder, model.gpu(), &cross, &meta.gen)?;
        self.entries.push(Entry {
            tag,
            job,
            meta,
            pieces: Pieces::default(),
            clock: Stopwatch::start(),
        });
        Ok(())
    }

    /// Remove the tasks `cancelled` says are cancelled; returns their tags.
    pub fn cancel(&mut self, cancelled: impl Fn(&T) -> bool) -> Vec<T> {
        let mut gone = Vec::new();
        self.entries.retain(|e| {
            let c = cancelled(&e.tag);
            if c {
                gone.push(e.tag);
            }
            !c
        });
        if !gone.is_empty() {
            self.step_plan = None; // it keeps the buffers of the tasks it steps alive
        }
        gone
    }

    /// One step of every task: one submit, one decoder step for all the tasks that need one. A failure
    /// of one task's step ends that task; a failure of the shared step ends them all.
    pub async fn step(&mut self) -> Vec<BatchEvent<T>> {
        let mut events = Vec::new();
        let mut failed: Vec<(usize, crate::Error)> = Vec::new();
        let gpu = self.pipeline.gpu().clone();
        let mut rec = Recorder::new(&gpu);
        rec.set_phase("decode");
        let mut run = Vec::new();
        let mut new = Vec::new();
        for i in 0..self.entries.len() {
            match self.entries[i].job.begin(&mut rec, &mut new) {
                Ok(Begin::Run(pos)) => run.push((i, pos)),
                Ok(_) => {}
                Err(err) => failed.push((i, err)),
            }
            self.push_tokens(i, &mut new, &mut events);
        }
        if !run.is_empty() {
            if let Err(err) = self.record_step(&mut rec, &run) {
                let msg = err.to_string();
                for &(i, _) in &run {
                    failed.push((i, shared_failure(&err, &msg)));
                }
                run.clear();
            }
        }
        let mut picked = Vec::new();
        for &(i, _) in &run {
            match self.entries[i].job.record_pick(&mut rec) {
                Ok(()) => picked.push(i),
                Err(err) => failed.push((i, err)),
            }
        }
        if let Err(err) = rec.submit() {
            let msg = err.to_string();
            for i in picked.drain(..) {
                failed.push((i, shared_failure(&err, &msg)));
            }
        }
        for i in picked {
            if let Err(err) = self.entries[i].job.resolve(&mut new).await {
                failed.push((i, err));
            }
            self.push_tokens(i, &mut new, &mut events);
        }
        self.finish(failed, &mut events);
        events
    }

    /// Record the decoder step of the `run` tasks: a task alone runs its recorded step
    /// (`step_planned`), several share one `step_batch`.
    fn record_step(&mut self, rec: &mut Recorder, run: &[(usize, u32)]) -> Result<()> {
        let decoder = &self.pipeline.model().decoder;
        if let [(i, pos)] = run {
            let state = self.entries[*i]
                .job
                .state_mut()
                .ok_or_else(|| crate::Error::shape("batched decode", "a step without a state"))?;
            decoder.step_planned(rec, *pos, state)?;
            return Ok(());
        }
        let rows: usize = run.iter().map(|&(i, _)| self.entries[i].job.rows()).sum();
        self.peak_rows = self.peak_rows.max(rows);
        if self.scratch.as_ref().is_none_or(|s| s.rows() < rows) {
            // Grown to the most rows seen (never shrunk while the batch lives).
            self.scratch = None;
            self.step_plan = None;
            let gpu = self.pipeline.gpu();
            self.scratch = Some(decoder.batch_scratch(gpu, self.peak_rows)?);
        }
        let states: Vec<&DecoderState> = run
            .iter()
            .filter_map(|&(i, _)| self.entries[i].job.state())
            .collect();
        let Some(scratch) = &self.scratch else {
            return Ok(());
        };
        let key: Vec<u64> = states.iter().map(|s| s.id()).collect();
        let mut plan = match self.step_plan.take() {
            Some((k, plan)) if k == key => Some(plan),
            _ => None,
        };
        self.batched_steps += 1;
        self.recorded_steps += usize::from(plan.is_none());
        let done = rec.replay_cached(&mut plan, |rec| decoder.step_batch(rec, &states, scratch));
        self.step_plan = plan.map(|p| (key, p));
        done
    }

    fn push_tokens(&mut self, i: usize, new: &mut Vec<u32>, events: &mut Vec<BatchEvent<T>>) {
        if new.is_empty() {
            return;
        }
        let tok = self.pipeline.tokenizer();
        let e = &mut self.entries[i];
        let pieces = new
            .drain(..)
            .map(|id| (e.pieces.push(tok, id), id))
            .collect();
        events.push(BatchEvent::Tokens(e.tag, pieces));
    }

    /// Remove the failed and the finished tasks, with their events.
    fn finish(&mut self, failed: Vec<(usize, crate::Error)>, events: &mut Vec<BatchEvent<T>>) {
        let before = self.entries.len();
        let mut failed = failed;
        failed.sort_by_key(|f| std::cmp::Reverse(f.0));
        failed.dedup_by_key(|f| f.0);
        for (i, err) in failed {
            let e = self.entries.remove(i);
            events.push(BatchEvent::Done(e.tag, Box::new(Err(err))));
        }
        let mut i = 0;
        while i < self.entries.len() {
            if !self.entries[i].job.is_done() {
                i += 1;
                continue;
            }
            let e = self.entries.remove(i);
            let decode_ms = e.clock.ms();
            let ids = e.job.into_ids();
            let out = self
                .pipeline
                .finish_task(e.meta, ids, decode_ms, &Callbacks::default());
            events.push(BatchEvent::Done(e.tag, Box::new(out)));
        }
        if self.entries.len() < before {
            self.step_plan = None; // it keeps the buffers of the tasks that left alive
        }
    }
}

/// The error of a step every task shared, for each of them (errors are not `Clone`; a lost device
/// stays a lost device, an out-of-memory stays one).
fn shared_failure(err: &crate::Error, msg: &str) -> crate::Error {
    use crate::Error as E;
    match err {
        E::DeviceLost(_) => E::DeviceLost(msg.to_owned()),
        E::OutOfMemory(_) => E::OutOfMemory(msg.to_owned()),
        _ => E::Gpu(msg.to_owned()),
    }
}
