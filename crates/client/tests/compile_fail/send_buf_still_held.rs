// A buffer being sent cannot be changed in flight: post takes it by value.
use softverbs::{Op, SendWork};
fn main() {
    let ctx = softverbs::Context::open(0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4).unwrap();
    let qp = ctx
        .create_qp(&softverbs::QpInit::new(softverbs::QpType::Rc, &pd).cqs(&cq, &cq))
        .unwrap();
    let mut mr = pd.alloc_mr(4096, softverbs::Access::LOCAL_WRITE).unwrap();
    let buf = mr.take(64).unwrap();
    let keep = &buf;
    qp.post(SendWork::new(Op::Send, buf)).unwrap();
    println!("{}", keep.len());
}
