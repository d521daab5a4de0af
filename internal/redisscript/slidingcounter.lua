return redis.error_reply('sluice: slidingcounter is not written yet')
