"""The built-in recipe: a small ESM-2-style protein masked language model."""
