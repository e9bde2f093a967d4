// Gradients from autograd to the engine: a post hook on each parameter's gradient accumulator
// runs as soon as autograd has accumulated that gradient, in backward order, so at stages 2-3 a
// bucket's reduce-scatter starts while the rest of backward goes on.
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "torch/optimizer_state.h"

namespace zeroshard::torch {

namespace {

class HandOverGradient : public ::torch::autograd::FunctionPostHook {
 public:
  HandOverGradient(Optimizer::State& state, int index) : state_(state), index_(index) {}
  ::torch::autograd::variable_list operator()(
      const ::torch::autograd::variable_list& outputs,
      const ::torch::autograd::variable_list& /*inputs*/) override {
    state_.hand_over_gradient(index_);
    return outputs;
  }

 private:
  Optimizer::State& state_;
  int index_;
};

}  // namespace

void Optimizer::State::install_gradient_hooks() {
  for (std::size_t i = 0; i < params.size(); ++i) {
    ManagedParam& param = params[i];
    if (!param.parameter.trainable()) continue;
    const at::Tensor& tensor = param.backing.tensor();
    if (!per_parameter_grads) {
      // Autograd accumulates into a defined .grad() in place, so backward writes straight into
      // the memory the engine reduces.
      param.grad_view = detail::view_of(param.parameter.raw_grad(), engine.model_dtype(),
                                        engine.device(), param.parameter.shape());
      tensor.mutable_grad() = param.grad_view;
    }
    param.accumulator = ::torch::autograd::impl::grad_accumulator(tensor);
    param.accumulator->add_post_hook(
        std::make_unique<HandOverGradient>(*this, static_cast<int>(i)));
  }
}

void Optimizer::State::hand_over_gradient(int index) {
  ManagedParam& param = params[static_cast<std::size_t>(index)];
  at::Tensor& grad = param.backing.tensor().mutable_grad();
  if (!per_parameter_grads) {
    // .grad() was replaced since zero_grad() (set to none, say): its values join the engine's.
    if (grad.defined() && !grad.is_same(param.grad_view)) {
      param.grad_view.add_(grad);
      grad = param.grad_view;
    }
    engine.grad_ready(param.parameter);
    return;
  }
  const GradTarget target = param.parameter.grad_target();
  at::Tensor slot =
      detail::view_of(target.data, engine.model_dtype(), engine.device(), param.parameter.shape());
  if (target.accumulate) {
    slot.add_(grad);
  } else {
    slot.copy_(grad);
  }
  engine.grad_ready(param.parameter);
  grad = at::Tensor();
  if (param.unit != nullptr) param.unit->gradient_handed_over();
}

}  // namespace zeroshard::torch
