"""How it learns: one LightningModule per loop shape, composing pure functions from losses/."""
