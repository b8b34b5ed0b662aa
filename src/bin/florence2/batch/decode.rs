//! Reading and decoding a batch's images on other threads while the model works: `threads` decoders
//! take every `threads`-th image each and hand them over in input order, each at most one image ahead
//! (memory stays bounded whatever the batch's length).

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};

use image::RgbImage;

use florence2_wasm::processor::image::{decode_image, ImageLimits};
use florence2_wasm::{files, Error, Result};

/// Decoding threads: the cores, at most 4 (the model's own work runs beside them).
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4)
}

/// The file at `path` decoded as the pipeline decodes image bytes (same limits, same result).
fn read_and_decode(path: &Path, limits: &ImageLimits) -> Result<RgbImage> {
    let bytes = files::read_capped(path, limits.max_alloc_bytes)?;
    // A decoder bug must cost this image, not the batch.
    std::panic::catch_unwind(|| decode_image(&bytes, limits))
        .unwrap_or_else(|_| Err(Error::Image("the decoder failed on this image".into())))
}

/// The decoded images, in order: `next()` returns image `i` on its `i`-th call.
pub struct Decoded {
    rxs: Vec<Receiver<Result<RgbImage>>>,
    next: usize,
}

impl Decoded {
    pub fn next_image(&mut self) -> Result<RgbImage> {
        let i = self.next;
        self.next += 1;
        let rx = &self.rxs[i % self.rxs.len()];
        rx.recv()
            .unwrap_or_else(|_| Err(Error::Image("the decoding thread stopped".into())))
    }
}

/// Run `f` with the images of `paths` decoding on `threads` threads; returns what `f` returns (the
/// threads stop early when `f` does).
pub fn with_decoded<R>(
    paths: &[PathBuf],
    limits: ImageLimits,
    threads: usize,
    f: impl FnOnce(&mut Decoded) -> R,
) -> R {
    let threads = threads.max(1);
    std::thread::scope(|s| {
        let mut rxs = Vec::with_capacity(threads);
        for t in 0..threads {
            let (tx, rx) = sync_channel(1);
            rxs.push(rx);
            s.spawn(move || {
                for p in paths.iter().skip(t).step_by(threads) {
                    if tx.send(read_and_decode(p, &limits)).is_err() {
                        return; // the consumer stopped
                    }
                }
            });
        }
        let mut decoded = Decoded { rxs, next: 0 };
        // `decoded` (the receivers) is dropped when `f` returns, before the scope joins the threads:
        // a thread blocked on a full channel sees the closed channel and ends.
        f(&mut decoded)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_come_back_in_order_with_their_errors() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images");
        let paths: Vec<PathBuf> = [
            "scene.png",
            "missing.png",
            "grey.png",
            "scene.jpg",
            "rgba.png",
        ]
        .iter()
        .map(|n| dir.join(n))
        .collect();
        let limits = ImageLimits::default();
        for threads in [1, 2, 3] {
            let got: Vec<Result<RgbImage>> = with_decoded(&paths, limits, threads, |d| {
                (0..paths.len()).map(|_| d.next_image()).collect()
            });
            for (p, g) in paths.iter().zip(got) {
                match read_and_decode(p, &limits) {
                    Ok(want) => assert_eq!(g.unwrap(), want, "{}", p.display()),
                    Err(_) => assert!(g.is_err()),
                }
            }
        }
        // Stopping early ends the threads (the scope returns).
        let first = with_decoded(&paths, limits, 2, |d| d.next_image().map(|i| i.width()));
        assert!(first.is_ok());
    }
}
