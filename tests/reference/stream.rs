//! The streaming loader on the original-named (f16) and mlx channels-last (bf16, GPU permutes) variants,
//! whose names come from the reference mapping: any chunking equals the ranged loader.

use crate::weights_util::*;

#[test]
fn original_and_mlx_any_chunking_matches_ranged_loader() {
    let gpu = gpu();
    let cfg = mapping_config_json();
    check_any_chunking(&gpu, &cfg, Variant::Original, Dt::F16, false);
    check_any_chunking(&gpu, &cfg, Variant::Mlx, Dt::BF16, true);
}
