"""The Personalizer-compatible facade: Rank, Reward and Activate in Azure Personalizer's shapes."""
