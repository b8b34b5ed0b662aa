// The model's thread: the package's own worker module (florence2-wasm/worker), driven from app.js by
// `Florence2Worker`. WebGPU works in workers, so loading weights and decoding tokens never block the page.
import "./pkg/worker.js";
