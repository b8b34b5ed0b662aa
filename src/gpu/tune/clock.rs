//! The clock the tuner's budget and wall-time samples read. Tests inject a fake one.

/// A source of milliseconds for the budget and for wall-time samples.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> f64;
}

/// The real clock: `Instant` natively, `performance.now()` in the browser.
#[derive(Clone, Copy, Debug, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now_ms(&self) -> f64 {
        now_ms()
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn now_ms() -> f64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
}

/// `performance.now()` where the global has it (pages and workers), else `Date.now()`.
#[cfg(target_arch = "wasm32")]
fn now_ms() -> f64 {
    use wasm_bindgen::JsCast;
    let perf = js_sys::Reflect::get(&js_sys::global(), &"performance".into()).ok();
    if let Some(p) = perf.filter(|p| p.is_object()) {
        if let Ok(f) = js_sys::Reflect::get(&p, &"now".into()) {
            if let Ok(f) = f.dyn_into::<js_sys::Function>() {
                if let Some(t) = f.call0(&p).ok().and_then(|v| v.as_f64()) {
                    return t;
                }
            }
        }
    }
    js_sys::Date::now()
}
