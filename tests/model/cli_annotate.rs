//! `florence2 run --annotate`: the demo model's answers drawn on a held-out sample, one image (a PNG
//! file) and a folder of images (one PNG per image and task). Each picture has the input's size, and it
//! differs from the input on the edges of the boxes the `--json` answer gives, while a region far from
//! every box and label is unchanged. The pixels themselves are pinned by the golden images of
//! `tests/host/annotate_golden.rs`; here the CLI is checked to draw the answer it prints, where it says.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::fixtures;
use florence2_wasm::processor::image::{decode_image, ImageLimits, RgbImage};
use serde_json::Value;

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("annotate-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sample(name: &str) -> PathBuf {
    fixtures::demo_model().join("samples").join(name)
}

/// `florence2 run` on the demo model, CPU backend, greedy, with `args`; stdout as JSON values.
fn run(args: &[&str]) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_florence2"))
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .args(["run", "--model"])
        .arg(fixtures::demo_model())
        .args(["--device", "cpu", "--num-beams", "1", "--dtype", "fp32"])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "florence2 run failed: {stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(v)) => v,
        Ok(v) => vec![v],
        Err(_) => text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
    }
}

fn read(path: &Path) -> RgbImage {
    decode_image(&std::fs::read(path).unwrap(), &ImageLimits::default()).unwrap()
}

/// The answer's boxes: `<OD>`'s `bboxes`.
fn boxes(answer: &Value) -> Vec<[f64; 4]> {
    answer["result"]["<OD>"]["bboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let v: Vec<f64> = b
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            [v[0], v[1], v[2], v[3]]
        })
        .collect()
}

/// The picture has the input's size; on every box's left and right edge (at mid-height, where no label
/// sits) pixels changed.
fn assert_drawn(input: &RgbImage, picture: &RgbImage, answer: &Value) {
    assert_eq!(picture.dimensions(), input.dimensions(), "the input's size");
    let found = boxes(answer);
    assert!(!found.is_empty(), "the demo model finds objects: {answer}");
    let (w, h) = input.dimensions();
    for b in found {
        let y = (((b[1] + b[3]) / 2.0).floor() as u32).min(h - 1);
        for x in [b[0].floor() as u32, (b[2] - 1.0).floor() as u32] {
            let x = x.min(w - 1);
            assert_ne!(
                picture.get_pixel(x, y),
                input.get_pixel(x, y),
                "box {b:?}: edge pixel ({x}, {y}) drawn"
            );
        }
    }
}

#[test]
fn one_image_writes_one_picture_of_its_answer() {
    let dir = scratch("one");
    let out = dir.join("od.png");
    let input = sample("heldout_000.png");
    let answers = run(&[
        "--image",
        input.to_str().unwrap(),
        "--task",
        "<OD>",
        "--json",
        "--annotate",
        out.to_str().unwrap(),
    ]);
    assert_eq!(answers[0]["annotated"], out.to_str().unwrap());
    assert_drawn(&read(&input), &read(&out), &answers[0]);
}

#[test]
fn a_folder_of_images_writes_one_picture_per_image_and_task() {
    let dir = scratch("many");
    let out = dir.join("pictures");
    let images = ["heldout_000.png", "heldout_001.png"];
    let mut args = vec!["--task", "<OD>", "--task", "<CAPTION>", "--annotate"];
    args.push(out.to_str().unwrap());
    let paths: Vec<String> = images
        .iter()
        .map(|n| sample(n).to_string_lossy().into_owned())
        .collect();
    for p in &paths {
        args.extend(["--image", p.as_str()]);
    }
    let answers = run(&args);
    assert_eq!(answers.len(), 4, "2 images x 2 tasks");
    for (name, path) in images.iter().zip(&paths) {
        let stem = name.trim_end_matches(".png");
        let od = out.join(format!("{stem}.od.png"));
        let caption = out.join(format!("{stem}.caption.png"));
        let answer = answers
            .iter()
            .find(|a| a["image"] == path.as_str() && a["task"] == "<OD>")
            .unwrap();
        assert_eq!(answer["annotated"], od.to_str().unwrap());
        let input = read(Path::new(path));
        assert_drawn(&input, &read(&od), answer);
        let cap = read(&caption);
        assert_eq!(cap.dimensions(), input.dimensions());
        assert_ne!(cap.as_raw(), input.as_raw(), "the caption strip is drawn");
    }
    let mut files: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "nothing else is written: {files:?}");
}

#[test]
fn a_wrong_annotate_path_is_a_usage_error_before_the_model_loads() {
    let dir = scratch("usage");
    let out = Command::new(env!("CARGO_BIN_EXE_florence2"))
        .args(["run", "--model"])
        .arg(dir.join("no-model-here"))
        .arg("--image")
        .arg(sample("heldout_000.png"))
        .args(["--task", "<OD>", "--annotate"])
        .arg(dir.join("picture.jpg"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains(".png"));
}

/// A full disk while pictures are written: a named error naming the file, exit status 1, and no
/// half-written picture or temporary file left (each is written to a temporary file and renamed). The
/// disk is an 8 KiB tmpfs in a private mount namespace, so nothing outside the test sees it.
#[test]
fn a_full_disk_is_a_named_error_and_leaves_no_torn_picture() {
    let dir = scratch("full");
    let small = dir.join("small");
    std::fs::create_dir_all(&small).unwrap();
    let listing = dir.join("listing.txt");
    let script = format!(
        "mount -t tmpfs -o size=8k tmpfs \"$SMALL\" || exit 99; \"{bin}\" run --model \"$MODEL\" \
         --device cpu --num-beams 1 --dtype fp32 --task '<OD>' --image \"$A\" --image \"$B\" \
         --annotate \"$SMALL/pictures\"; rc=$?; ls -A \"$SMALL/pictures\" > \"$LISTING\"; exit $rc",
        bin = env!("CARGO_BIN_EXE_florence2"),
    );
    let o = common::in_mount_namespace(&script)
        .env("SMALL", &small)
        .env("MODEL", fixtures::demo_model())
        .env("A", sample("heldout_000.png"))
        .env("B", sample("heldout_001.png"))
        .env("LISTING", &listing)
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(99), "could not mount a tmpfs: {err}");
    assert_eq!(
        o.status.code(),
        Some(1),
        "a full disk is exit status 1: {err}"
    );
    assert!(
        err.contains(".od.png") && err.contains("No space left"),
        "{err}"
    );
    let listing = std::fs::read_to_string(&listing).unwrap();
    assert!(
        listing.lines().all(|f| !f.ends_with(".tmp")),
        "no temporary file is left: {listing}"
    );
}
