return redis.error_reply('sluice: slidinglog is not written yet')
