// Gradients from autograd to the engine: at step(), as torch::optim reads .grad(), or, with
// reduce_during_backward, from a post hook on each parameter's gradient accumulator as soon as
// autograd has accumulated it, so that at stages 2-3 a bucket's reduce-scatter starts while the
// rest of backward goes on.
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
    param.hook = param.accumulator->add_post_hook(
        std::make_unique<HandOverGradient>(*this, static_cast<int>(i)));
  }
}

namespace {

// The gradient's values live in `grad_view` when .grad() is it or an alias of it (a module's
// zero_grad() makes .grad() a detached alias).
bool views_engine_memory(const at::Tensor& grad, const at::Tensor& grad_view) {
  return grad.defined() && grad.data_ptr() == grad_view.data_ptr();
}

// Per-parameter gradients: `grad` goes into the engine's place for it, added or written as the
// engine says, and the engine takes it; .grad() is left undefined.
void hand_over_to_engine(Engine& engine, ManagedParam& param, at::Tensor& grad) {
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
}

}  // namespace

void Optimizer::State::hand_over_gradient(int index) {
  ManagedParam& param = params[static_cast<std::size_t>(index)];
  if (!reduce_during_backward) {
    // The gradient stays in .grad() until step(); the unit's backward gather may go.
    if (param.unit != nullptr) param.unit->gradient_handed_over();
    return;
  }
  if (param.handed_over) {
    throw UsageError("zeroshard::torch::Optimizer: parameter '" + param.parameter.name() +
                     "' got a gradient from a second backward() before step(); with "
                     "OptimizerOptions::reduce_during_backward each micro-step takes one "
                     "backward() through the model. Add the losses and call backward() once, or "
                     "leave reduce_during_backward false");
  }
  param.handed_over = true;
  detail::follow_current_stream(engine);
  at::Tensor& grad = param.backing.tensor().mutable_grad();
  if (!per_parameter_grads) {
    // .grad() was replaced since zero_grad() (set to none, say): its values join the engine's.
    if (grad.defined() && !views_engine_memory(grad, param.grad_view)) {
      param.grad_view.add_(grad);
    }
    grad = param.grad_view;
    engine.grad_ready(param.parameter);
    return;
  }
  hand_over_to_engine(engine, param, grad);
  if (param.unit != nullptr) param.unit->gradient_handed_over();
}

void Optimizer::State::hand_over_gradients() {
  if (reduce_during_backward) return;
  // Last registered first: the order the engine's buckets are reduced in.
  for (std::size_t i = params.size(); i-- > 0;) {
    ManagedParam& param = params[i];
    if (!param.parameter.trainable()) continue;
    at::Tensor& grad = param.backing.tensor().mutable_grad();
    if (!per_parameter_grads) {
      // torch::optim reads .grad() as it is: a caller that set it to none (libtorch 2.x's
      // zero_grad()) dropped what the engine's memory held, and a new tensor replaces it.
      if (!grad.defined()) {
        param.grad_view.zero_();
      } else if (!views_engine_memory(grad, param.grad_view)) {
        param.grad_view.copy_(grad);
      }
      grad = param.grad_view;
      continue;
    }
    if (!grad.defined()) continue;  // no gradient: zero, for all_grads_ready()
    hand_over_to_engine(engine, param, grad);
  }
}

}  // namespace zeroshard::torch
