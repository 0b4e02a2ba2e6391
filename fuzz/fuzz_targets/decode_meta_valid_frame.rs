#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferry_image_fuzz::decode_meta_valid_frame(data);
});
