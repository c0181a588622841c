//! Finding the latest complete training checkpoint (Megatron-LM, DeepSpeed, PyTorch DCP, Hugging Face Trainer).
