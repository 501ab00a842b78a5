//! Link as a Kore ring-3 image.
fn main() {
    kore_rt_build::link_user_image();
}
