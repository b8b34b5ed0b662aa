//! Native GPU failures (wgpu on lavapipe): a lost device is `Error::DeviceLost` (named
//! `DeviceLostError`) at the next operation; errors inside [`Device::scoped`] are reported by that call and
//! leave nothing for the next one.
#![cfg(not(target_arch = "wasm32"))]

use florence2_wasm::gpu::{readback, Device, DeviceOptions, Tensor};
use florence2_wasm::Error;

fn gpu() -> std::sync::Arc<Device> {
    pollster::block_on(Device::new(DeviceOptions::default())).unwrap()
}

#[test]
fn lost_device_is_named_device_lost() {
    let gpu = gpu();
    let t = Tensor::from_f32(&gpu, &[4], &[1.0, 2.0, 3.0, 4.0], "t").unwrap();
    assert_eq!(
        readback::to_f32_blocking(&gpu, &t).unwrap(),
        [1.0, 2.0, 3.0, 4.0]
    );
    assert!(!gpu.is_lost());
    gpu.destroy();
    // wgpu-core runs the lost callback when the device is destroyed and polled.
    let _ = gpu
        .wgpu()
        .expect("a GPU device")
        .device
        .poll(wgpu::PollType::Poll);
    assert!(gpu.is_lost(), "lost callback did not run");
    let e = readback::to_f32_blocking(&gpu, &t).unwrap_err();
    assert!(matches!(e, Error::DeviceLost(_)), "{e}");
    assert_eq!(e.name(), "DeviceLostError");
    assert!(e.to_string().contains("lost"), "{e}");
}

#[test]
fn scoped_reports_its_own_gpu_errors_and_leaves_none_behind() {
    let gpu = gpu();
    // MAP_READ may only be combined with COPY_DST: a validation error inside the scope.
    let r: Result<(), Error> = pollster::block_on(gpu.scoped(async {
        let _bad =
            gpu.wgpu()
                .expect("a GPU device")
                .device
                .create_buffer(&wgpu::BufferDescriptor {
                    label: Some("invalid usage"),
                    size: 16,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                });
        Ok(())
    }));
    let e = r.unwrap_err();
    assert!(matches!(e, Error::Gpu(_)), "{e}");
    // Captured by the scope: nothing left for the next request.
    gpu.check().unwrap();
    let t = Tensor::from_f32(&gpu, &[2], &[5.0, 6.0], "after").unwrap();
    assert_eq!(readback::to_f32_blocking(&gpu, &t).unwrap(), [5.0, 6.0]);
    // A request's own error comes back unchanged when the GPU had none.
    let r: Result<(), Error> =
        pollster::block_on(gpu.scoped(async { Err(Error::Prompt("bad".into())) }));
    assert!(matches!(r, Err(Error::Prompt(_))));
}
