//! The package's build script (Cargo.toml `build`): with the `libjpeg-turbo` feature (on by default) and a
//! native target, links the system libjpeg-turbo's TurboJPEG library (`libturbojpeg`, found by
//! pkg-config) for src/processor/turbojpeg.rs, and fails with instructions when it is missing. Does
//! nothing for wasm32 or without the feature.

fn main() {
    println!("cargo:rerun-if-changed=scripts/build/link_libjpeg_turbo.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if std::env::var_os("CARGO_FEATURE_LIBJPEG_TURBO").is_none()
        || std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32")
    {
        return;
    }
    // The TurboJPEG 2.x API (tjDecompressHeader3, tjDecompress2): libjpeg-turbo 2.0 and later.
    if let Err(e) = pkg_config::Config::new()
        .atleast_version("2.0")
        .probe("libturbojpeg")
    {
        eprintln!(
            "\nerror: florence2-wasm decodes JPEGs natively with libjpeg-turbo (the `libjpeg-turbo` \
             feature, on by default), but pkg-config cannot find libturbojpeg >= 2.0.\n\
             Install it (Debian/Ubuntu: `apt-get install libturbojpeg0-dev`, which scripts/setup.sh does; \
             Fedora: turbojpeg-devel; macOS: brew install jpeg-turbo), or build with \
             `--no-default-features` to decode JPEGs with the image crate instead (up to 3 grey levels \
             from Pillow's pixels).\npkg-config said: {e}\n"
        );
        std::process::exit(1);
    }
}
