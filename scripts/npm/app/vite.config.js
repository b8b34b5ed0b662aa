// The one line Vite's dev server needs: do not pre-bundle the package (pre-bundling moves its JS away from
// the .wasm it loads with `new URL(..., import.meta.url)`). Production builds work without it.
export default {
  optimizeDeps: { exclude: ["florence2-wasm"] },
  worker: { format: "es" },
  logLevel: "warn",
};
