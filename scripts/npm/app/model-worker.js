// The model's worker: one import serves Florence2Worker's requests.
import "florence2-wasm/worker";
